//! The OS disk of the simulated Bottlerocket node: its two partition sets
//! and their GPT priority flags, as signpost keeps them
//! (bottlerocket-os/bottlerocket-core-kit, `sources/updater/signpost/src/`,
//! commit a10182f):
//!
//! - `gptprio.rs`: the flags `priority`, `tries_left`, `successful`, and
//!   `will_boot` = `(priority > 0 && tries_left > 0) || successful`;
//! - `state.rs`: `next` (the set that boots: the bootable one, the higher
//!   priority if both are), `clear_inactive` (priority 0, tries 0, not
//!   successful: what updog does before it writes an image),
//!   `mark_inactive_valid` (tries 1, once the image is written),
//!   `upgrade_to_inactive` (`activate`: refuses unless the inactive set has
//!   priority 0, is not marked successful and has tries left; then priority
//!   2 and the active set's 1), `cancel_upgrade` (`deactivate`: priority 0,
//!   the active set's 2), `rollback_to_inactive` (`signpost
//!   rollback-to-inactive`: refuses unless the inactive set will boot) and
//!   `mark_successful_boot` (run once a boot succeeded);
//! - the errors each refusal prints (`error.rs`).
//!
//! The bootloader (GRUB's gptprio) spends one try when it boots a set that
//! has not yet booted successfully.

use semver::Version;

/// The device signpost names in its errors.
pub const OS_DISK: &str = "/dev/nvme0n1";

/// One partition set (boot, root, hash) and its flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionSet {
    /// The image written to it, if a whole one was.
    pub image: Option<Version>,
    pub priority: u8,
    pub tries_left: u8,
    pub successful: bool,
}

impl PartitionSet {
    /// signpost `GptPrio::will_boot`.
    pub fn will_boot(&self) -> bool {
        (self.priority > 0 && self.tries_left > 0) || self.successful
    }

    /// How signpost prints the flags.
    pub fn flags(&self) -> String {
        format!(
            "priority={} tries_left={} successful={}",
            self.priority, self.tries_left, self.successful
        )
    }
}

/// The two sets; `active` is the one the root filesystem runs from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub sets: [PartitionSet; 2],
    pub active: usize,
}

impl Disk {
    /// A node running `running`, booted successfully; the other set holds
    /// `inactive` as an earlier upgrade left it (booted successfully once,
    /// priority 1), or nothing bootable.
    pub fn new(running: Version, inactive: Option<Version>) -> Disk {
        let active = PartitionSet {
            image: Some(running),
            priority: 2,
            tries_left: 0,
            successful: true,
        };
        let other = match inactive {
            Some(v) => PartitionSet {
                image: Some(v),
                priority: 1,
                tries_left: 0,
                successful: true,
            },
            None => PartitionSet {
                image: None,
                priority: 0,
                tries_left: 0,
                successful: false,
            },
        };
        Disk {
            sets: [active, other],
            active: 0,
        }
    }

    pub fn running(&self) -> Version {
        self.sets[self.active]
            .image
            .clone()
            .expect("the active set holds the running image")
    }

    pub fn inactive(&self) -> &PartitionSet {
        &self.sets[1 - self.active]
    }

    fn inactive_mut(&mut self) -> &mut PartitionSet {
        &mut self.sets[1 - self.active]
    }

    fn active_mut(&mut self) -> &mut PartitionSet {
        &mut self.sets[self.active]
    }

    /// signpost `State::next`: the set the next boot takes, if any.
    pub fn next(&self) -> Option<usize> {
        match (self.sets[0].will_boot(), self.sets[1].will_boot()) {
            (true, true) if self.sets[0].priority >= self.sets[1].priority => Some(0),
            (true, true) => Some(1),
            (true, false) => Some(0),
            (false, true) => Some(1),
            (false, false) => None,
        }
    }

    /// Whether the next boot takes the inactive set.
    pub fn inactive_is_next(&self) -> bool {
        self.next() == Some(1 - self.active)
    }

    /// signpost `clear_inactive`, written at once (updog `update_image`):
    /// the set is about to be overwritten and must not boot meanwhile.
    pub fn clear_inactive(&mut self) {
        let s = self.inactive_mut();
        s.priority = 0;
        s.tries_left = 0;
        s.successful = false;
        s.image = None;
    }

    /// updog wrote all of `version` to the inactive set, then
    /// `mark_inactive_valid`.
    pub fn write_inactive(&mut self, version: Version) {
        self.clear_inactive();
        let s = self.inactive_mut();
        s.image = Some(version);
        s.tries_left = 1;
    }

    /// signpost `upgrade_to_inactive` (updog `update-apply`, the API's
    /// activate).
    pub fn upgrade_to_inactive(&mut self) -> Result<(), String> {
        let s = self.inactive();
        if s.priority != 0 || s.successful {
            return Err(format!(
                "Inactive partition {OS_DISK} is already marked for upgrade"
            ));
        }
        if s.tries_left == 0 {
            return Err(format!(
                "Inactive partition {OS_DISK} has not been marked valid for upgrade"
            ));
        }
        let s = self.inactive_mut();
        s.priority = 2;
        s.successful = false;
        self.active_mut().priority = 1;
        Ok(())
    }

    /// signpost `cancel_upgrade` (updog `update-revert`, the API's deactivate).
    pub fn cancel_upgrade(&mut self) {
        self.inactive_mut().priority = 0;
        self.active_mut().priority = 2;
    }

    /// signpost `rollback_to_inactive` (`signpost rollback-to-inactive`,
    /// from a root shell on the node: the update API has no such action).
    pub fn rollback_to_inactive(&mut self) -> Result<(), String> {
        let s = self.inactive();
        if !s.will_boot() {
            return Err(format!(
                "Inactive partition is not valid to roll back to ({})",
                s.flags()
            ));
        }
        self.inactive_mut().priority = 2;
        self.active_mut().priority = 1;
        Ok(())
    }

    /// A reboot: the bootloader takes [`Disk::next`] (spending a try of a
    /// set not yet booted successfully), and once up the boot is marked
    /// successful. Returns the version now running.
    pub fn boot(&mut self) -> Version {
        if let Some(n) = self.next() {
            if self.sets[n].image.is_some() {
                let s = &mut self.sets[n];
                if !s.successful && s.tries_left > 0 {
                    s.tries_left -= 1;
                }
                self.active = n;
            }
        }
        self.active_mut().successful = true;
        self.running()
    }
}
