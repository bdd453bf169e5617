//! A simulated Bottlerocket node API on a Unix socket, with the upstream
//! semantics drover's Bottlerocket driver depends on, and a record of every
//! image written to the staging partition and every version booted.
//!
//! Each behaviour names the upstream file it comes from
//! (bottlerocket-os/bottlerocket-core-kit, commit a10182f):
//! - the API server's routes and status codes:
//!   `sources/api/apiserver/src/server/mod.rs`;
//! - settings applied in the background by `thar-be-settings --daemon`
//!   after the API answered: `sources/api/apiserver/src/server/controller.rs`
//!   (`apply_changes`), rendering `/etc/updog.toml` from
//!   `packages/os/updog-toml`;
//! - the update state machine, its lock and its status file:
//!   `sources/api/thar-be-updates/src/main.rs` (`drive_state_machine`,
//!   `fork_and_return!`) and `src/status.rs` (`update_available_updates`);
//! - which release updog offers and writes (waves, version lock), and what
//!   it says about it on stderr ("Starting update to V", "No update
//!   required"), which thar-be-updates keeps in the status' command result:
//!   `sources/updater/updog/src/main.rs` (`applicable_updates`,
//!   `update_required`, `main_inner`) and thar-be-updates' `status.rs`
//!   (`set_recent_command_info`);
//! - the partition sets' flags as signpost keeps them, what updog does to
//!   them (`clear_inactive` before it writes, `mark_inactive_valid` after;
//!   `update_image` in updog's `main.rs`) and what activate refuses:
//!   `support/bottlerocket/disk.rs`;
//! - how the update actions fail: updog loads its TUF metadata and the
//!   manifest before it touches the disk (`load_repository`,
//!   `load_manifest`), so a repository that does not answer or whose
//!   metadata expired fails a refresh or a prepare with nothing written
//!   ("Metadata error: ..."), while an image download that breaks off
//!   fails after `clear_inactive` ("Starting update to V" then "Failed
//!   writing update data to disk: ..."); thar-be-updates keeps the state it
//!   had and records the command `Failed` with updog's stderr (`prepare`,
//!   `activate`: the error propagates before `set_update_state`; `refresh`:
//!   back to `Idle` from `Idle`/`Available`);
//! - the reboot endpoint: `/sbin/shutdown -r now` before Bottlerocket
//!   1.22.0, which no shutdown inhibitor stops, `systemctl reboot
//!   --check-inhibitors=yes` since (core-kit commit e139cf49, first in
//!   core-kit 2.4.0, Bottlerocket 1.22.0), which a held inhibitor refuses:
//!   500 "Unable to reboot, ...";
//! - before Bottlerocket 1.20.0, a refresh chose the update from the API's
//!   committed settings (`GET /settings`) instead of a rendered file, while
//!   updog read `/etc/updog.toml`: bottlerocket-os/bottlerocket commit
//!   01c5e345 ("thar-be-updates: migrate to use configuration file", first
//!   released in v1.20.0) changed `update_available_updates` to read
//!   `/etc/thar-be-updates.toml`, rendered by the same thar-be-settings run
//!   as updog's file.
//!
//! Time runs on the wall clock: an action holds the update lock for its
//! configured duration and its result appears when it ends, as with the
//! forked thar-be-updates child.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use semver::Version;
use serde_json::{json, Value};

#[path = "bottlerocket/disk.rs"]
pub mod disk;
#[path = "bottlerocket/nodes.rs"]
pub mod nodes;
#[path = "bottlerocket/script.rs"]
pub mod script;
use disk::{Disk, PartitionSet};

/// The largest request head or body the simulator reads (requests are tiny).
const MAX_REQUEST: usize = 64 * 1024;
/// `handle`'s answer for a request whose answer is lost (the connection drops).
const ANSWER_LOST: u16 = 0;
/// `handle`'s answer for a request answered 204 once the test releases it.
const ANSWER_HELD: u16 = 1;
/// The first release whose API server has `PATCH /settings/keypair`
/// (mod.rs route added in Bottlerocket 1.21.0).
const KEYPAIR_SINCE: Version = Version::new(1, 21, 0);
/// The first release whose refresh reads the version lock from a rendered
/// file rather than the API's committed settings (see the module doc).
pub const CONFIG_FILE_SINCE: Version = Version::new(1, 20, 0);
/// The first release whose reboot endpoint honours shutdown inhibitors
/// (`systemctl reboot --check-inhibitors=yes`, see the module doc).
pub const INHIBITORS_SINCE: Version = Version::new(1, 22, 0);

/// How an update action fails (see the module doc for upstream's shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The update repository does not answer (network, proxy, CDN): updog
    /// fails loading its metadata, before it touches the disk.
    Unreachable,
    /// The repository's TUF metadata expired (a mirror not re-signed in
    /// time): refused before anything is written, on every try.
    Expired,
    /// The image download breaks off after updog cleared the inactive
    /// partition set (prepare only; a refresh downloads no image).
    Download,
}

/// An action failing `times` times in a row, then working (`usize::MAX`:
/// for good).
#[derive(Clone, Copy, Debug)]
pub struct Fails {
    pub how: Failure,
    pub times: usize,
}

/// A release in the update repository.
#[derive(Clone, Debug)]
pub struct Release {
    /// Its version.
    pub version: Version,
    /// Whether this node's wave has reached it (updog's `update_ready`).
    pub in_wave: bool,
}

/// How the simulated node starts, and its faults.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The version the node runs.
    pub running: Version,
    /// The update repository.
    pub releases: Vec<Release>,
    /// How long after `commit_and_apply` answered `/etc/updog.toml` shows the change
    /// (after the request of [`Scenario::render_after`], when that is set).
    pub settings_delay: Duration,
    /// The rendering loses the race to these requests: it starts only once
    /// the Nth request since the commit whose "METHOD URI" starts with this
    /// has been answered. A test that needs an update tool to read the old
    /// file uses this rather than a delay the machine's load could outrun.
    pub render_after: Option<(&'static str, usize)>,
    /// How long a refresh holds the update lock.
    pub refresh_takes: Duration,
    /// How long a prepare (download and write) holds the update lock.
    pub prepare_takes: Duration,
    /// How long an activate or deactivate holds the update lock.
    pub activate_takes: Duration,
    /// An update left activated (`Ready`) by an earlier attempt, at this version.
    pub stale_ready: Option<Version>,
    /// Another caller holds the update lock for this long from the start
    /// (e.g. a refresh of its own): every update call meanwhile gets 423.
    pub locked_at_start: Duration,
    /// ... and keeps it until this many requests were answered 423 (0: for
    /// `locked_at_start` only), so that a test sees the refusals however
    /// slowly the machine runs the script.
    pub locked_for_refusals: usize,
    /// A shutdown inhibitor is held (e.g. by a host container): from
    /// 1.22.0 the reboot endpoint refuses with 500; before, it reboots.
    pub inhibitor: bool,
    /// What the inactive partition set holds at the start: an earlier
    /// version, booted successfully once (as a finished upgrade leaves it),
    /// or nothing bootable.
    pub inactive: Option<Version>,
    /// How refreshes fail, before they work.
    pub refresh_fails: Option<Fails>,
    /// How prepares fail, before they work.
    pub prepare_fails: Option<Fails>,
    /// This many answers to `POST /tx/commit_and_apply` are lost after the
    /// commit took effect (the connection drops).
    pub lost_commit_answers: usize,
    /// The reboot request is answered only once the test releases it
    /// ([`BottlerocketApi::release_reboot`]).
    pub hold_reboot_answer: bool,
    /// How long the API does not answer after a reboot.
    pub reboot_downtime: Duration,
}

impl Scenario {
    /// A node at `running`, offered `releases` (all in its wave), with quick actions.
    pub fn new(running: &str, releases: &[&str]) -> Self {
        Scenario {
            running: v(running),
            releases: releases
                .iter()
                .map(|r| Release {
                    version: v(r),
                    in_wave: true,
                })
                .collect(),
            settings_delay: Duration::ZERO,
            render_after: None,
            refresh_takes: Duration::from_millis(100),
            prepare_takes: Duration::from_millis(200),
            activate_takes: Duration::from_millis(100),
            stale_ready: None,
            locked_at_start: Duration::ZERO,
            locked_for_refusals: 0,
            inhibitor: false,
            inactive: None,
            refresh_fails: None,
            prepare_fails: None,
            lost_commit_answers: 0,
            hold_reboot_answer: false,
            reboot_downtime: Duration::from_millis(300),
        }
    }

    /// `version`, a release this node's wave has not reached yet.
    pub fn out_of_wave(mut self, version: &str) -> Self {
        let version = v(version);
        for r in &mut self.releases {
            if r.version == version {
                r.in_wave = false;
            }
        }
        self
    }

    /// Refreshes fail `times` times as `how` says, then work.
    pub fn refresh_failing(mut self, how: Failure, times: usize) -> Self {
        self.refresh_fails = Some(Fails { how, times });
        self
    }

    /// Prepares fail `times` times as `how` says, then work.
    pub fn prepare_failing(mut self, how: Failure, times: usize) -> Self {
        self.prepare_fails = Some(Fails { how, times });
        self
    }
}

/// A version literal.
pub fn v(s: &str) -> Version {
    Version::parse(s).expect("version literal")
}

/// updog's config (`/etc/updog.toml`): what refresh and prepare read.
#[derive(Clone, Debug, PartialEq)]
struct UpdogConfig {
    version_lock: String,
    ignore_waves: bool,
}

/// One update command's result (status.rs `CommandResult`).
#[derive(Clone, Debug)]
struct CommandResult {
    cmd_type: &'static str,
    ok: bool,
    timestamp: String,
    stderr: String,
}

/// `/run/cache/thar-be-updates/status.json` (status.rs `UpdateStatus`).
#[derive(Clone, Debug)]
struct UpdateStatus {
    state: &'static str,
    available: Vec<Version>,
    chosen: Option<Version>,
    staging: Option<(Version, bool)>,
    recent: Option<CommandResult>,
}

/// An action running in thar-be-updates' forked child, holding the lock.
struct Running {
    until: Instant,
    status: UpdateStatus,
    disk: Disk,
}

struct State {
    arch: String,
    variant: String,
    releases: Vec<Release>,
    /// Committed settings (the datastore).
    datastore: UpdogConfig,
    /// Pending transactions.
    pending: BTreeMap<String, Value>,
    /// What updog reads now, and a rendering still to come.
    updog: UpdogConfig,
    render_at: Option<(Instant, UpdogConfig)>,
    settings_delay: Duration,
    /// A rendering waiting for [`Scenario::render_after`]'s requests.
    render_gate: Option<(&'static str, usize)>,
    render_waits: Option<(usize, UpdogConfig)>,
    takes: [Duration; 3],
    /// `None` until the first update command since boot (the status file lives in /run).
    status: Option<UpdateStatus>,
    running: Option<Running>,
    locked_until: Option<Instant>,
    /// 423 answers still due before `locked_until` is lifted.
    refusals_left: usize,
    disk: Disk,
    inhibitor: bool,
    refresh_fails: Option<Fails>,
    prepare_fails: Option<Fails>,
    lost_commit_answers: usize,
    hold_reboot_answer: bool,
    /// Set by the test to let a held reboot answer go.
    reboot_released: bool,
    /// The reboot answer held until then.
    held_answer: Option<(u16, String)>,
    reboot_downtime: Duration,
    down_until: Option<Instant>,
    /// Reboots accepted, and refused.
    reboot_requests: usize,
    reboot_refusals: usize,
    /// Every image updog wrote to the staging partition, in order.
    staged: Vec<Version>,
    /// Every version booted after the first, in order.
    boots: Vec<Version>,
    /// Requests served, as "METHOD URI STATUS".
    log: Vec<String>,
    /// When each request of `log` was served.
    log_at: Vec<Instant>,
}

impl State {
    /// Finish what is due: the settings rendering, the action holding the lock.
    fn settle(&mut self, now: Instant) {
        if let Some((at, cfg)) = self.render_at.clone() {
            if now >= at {
                self.updog = cfg;
                self.render_at = None;
            }
        }
        if self.refusals_left == 0 && self.locked_until.is_some_and(|t| now >= t) {
            self.locked_until = None;
        }
        if self.running.as_ref().is_some_and(|r| now >= r.until) {
            let r = self.running.take().expect("checked");
            self.status = Some(r.status);
            self.disk = r.disk;
        }
    }

    fn lock_held(&self) -> bool {
        self.running.is_some() || self.locked_until.is_some()
    }

    /// updog's `applicable_updates`: this variant's releases in the node's
    /// wave (or all, with ignore-waves), newest first.
    fn applicable(&self) -> Vec<Version> {
        let mut out: Vec<Version> = self
            .releases
            .iter()
            .filter(|r| self.updog.ignore_waves || r.in_wave)
            .map(|r| r.version.clone())
            .collect();
        out.sort_by(|a, b| b.cmp(a));
        out
    }

    /// The release updog's rendered config selects (what prepare writes).
    fn selected(&self) -> Option<Version> {
        self.selected_by(&self.updog.version_lock)
    }

    /// The release a refresh chooses: from the rendered config since 1.20.0,
    /// from the API's committed settings before (see the module doc).
    fn chosen_by_refresh(&self) -> Option<Version> {
        if self.disk.running() < CONFIG_FILE_SINCE {
            self.selected_by(&self.datastore.version_lock)
        } else {
            self.selected()
        }
    }

    /// The release a version lock selects among what updog offers: status.rs
    /// `update_available_updates` (refresh) and updog's `update_required`
    /// (prepare) agree on it: the newest newer one for "latest", else the
    /// locked version if offered and not running.
    fn selected_by(&self, lock: &str) -> Option<Version> {
        let running = &self.disk.running();
        let offered = self.applicable();
        if lock == "latest" {
            return offered.into_iter().find(|u| u > running);
        }
        let lock = Version::parse(lock.trim_start_matches('v')).ok()?;
        if &lock == running {
            return None;
        }
        offered.into_iter().find(|u| *u == lock)
    }

    fn os(&self) -> Value {
        json!({
            "pretty_name": format!("Bottlerocket OS {} ({})", self.disk.running(), self.variant),
            "variant_id": self.variant,
            "version_id": self.disk.running().to_string(),
            "build_id": "0123abcd",
            "arch": self.arch,
        })
    }

    fn settings(&self) -> Value {
        json!({
            "motd": "Welcome to Bottlerocket!",
            "updates": {
                "version-lock": self.datastore.version_lock,
                "ignore-waves": self.datastore.ignore_waves,
                "seed": 1234,
            },
        })
    }

    fn image(&self, version: &Version) -> Value {
        json!({ "arch": self.arch, "version": version.to_string(), "variant": self.variant })
    }

    fn status_json(&self, s: &UpdateStatus) -> Value {
        json!({
            "update_state": s.state,
            "available_updates": s.available.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
            "chosen_update": s.chosen.as_ref().map(|c| self.image(c)),
            "active_partition": {
                "image": self.image(&self.disk.running()),
                "next_to_boot": !s.staging.as_ref().is_some_and(|(_, next)| *next),
            },
            "staging_partition": s.staging.as_ref().map(|(v, next)| json!({
                "image": self.image(v), "next_to_boot": next,
            })),
            "most_recent_command": s.recent.as_ref().map(|c| json!({
                "cmd_type": c.cmd_type,
                "cmd_status": if c.ok { "Success" } else { "Failed" },
                "timestamp": c.timestamp,
                "exit_status": if c.ok { 0 } else { 1 },
                "stderr": c.stderr,
            })),
        })
    }

    /// `POST /actions/<cmd>`: thar-be-updates' `drive_state_machine`. The
    /// parent answers at once (204, 409, 404 or 423); the result lands in
    /// the status file when the forked child ends.
    fn dispatch(&mut self, cmd: &'static str, now: Instant) -> (u16, String) {
        if self.lock_held() {
            // main.rs lock_exclusive: try_lock_exclusive fails -> UpdateLockHeld -> 423.
            return (423, "Update lock held".into());
        }
        let mut status = self.status.clone().unwrap_or(UpdateStatus {
            state: "Idle",
            available: vec![],
            chosen: None,
            staging: None,
            recent: None,
        });
        let mut disk = self.disk.clone();
        let mut stderr = String::new();
        let mut ok = true;
        let takes;
        match (cmd, status.state) {
            ("refresh", state) => {
                takes = self.takes[0];
                if let Some(how) = Self::failing(&mut self.refresh_fails) {
                    // main.rs refresh: `updog whats` failed -> Ok(false):
                    // Idle from Idle/Available, nothing else changes.
                    stderr = self.failure_text(how, None);
                    ok = false;
                    if state == "Idle" || state == "Available" {
                        status.state = "Idle";
                    }
                } else {
                    // `updog whats --all` lists from the config updog reads now;
                    // status.rs update_available_updates chooses among them.
                    status.available = self.applicable();
                    status.chosen = self.chosen_by_refresh();
                    if state == "Idle" || state == "Available" {
                        status.state = if status.chosen.is_some() {
                            "Available"
                        } else {
                            "Idle"
                        };
                    }
                }
            }
            ("prepare", "Available" | "Staged") => {
                let Some(chosen) = status.chosen.clone() else {
                    return (404, "Update does not exist".into());
                };
                takes = self.takes[1];
                // updog update-image writes what *its* config selects ("No
                // update required" writes nothing); thar-be-updates records
                // chosen_update as staged either way (main.rs prepare).
                // Its stderr is kept as the command's (set_recent_command_info).
                let selected = self.selected();
                match (Self::failing(&mut self.prepare_fails), selected) {
                    (Some(how), selected) => {
                        // The error propagates before set_update_state and
                        // set_staging_partition_image_info: state and
                        // bookkeeping stay as they were.
                        stderr = self.failure_text(how, selected.as_ref());
                        ok = false;
                        if how == Failure::Download && selected.is_some() {
                            disk.clear_inactive();
                        }
                    }
                    (None, Some(written)) => {
                        stderr = format!("Starting update to {written}\n");
                        disk.write_inactive(written.clone());
                        self.staged.push(written);
                        status.staging = Some((chosen, false));
                        status.state = "Staged";
                    }
                    (None, None) => {
                        stderr = "No update required\n".into();
                        status.staging = Some((chosen, false));
                        status.state = "Staged";
                    }
                }
            }
            ("activate", "Staged") => {
                let Some((staged, _)) = status.staging.clone() else {
                    return (404, "No staged image".into());
                };
                takes = self.takes[2];
                // updog update-apply: signpost upgrade_to_inactive, which
                // reads the disk's flags, not thar-be-updates' bookkeeping.
                match disk.upgrade_to_inactive() {
                    Ok(()) => {
                        status.staging = Some((staged, true));
                        status.state = "Ready";
                    }
                    Err(e) => {
                        stderr = format!("Could not mark inactive partition for boot: {e}\n");
                        ok = false;
                    }
                }
            }
            ("deactivate", "Ready") => {
                let Some((staged, _)) = status.staging.clone() else {
                    return (404, "No staged image".into());
                };
                disk.cancel_upgrade();
                status.staging = Some((staged, false));
                status.state = "Staged";
                takes = self.takes[2];
            }
            (cmd, state) => {
                return (
                    409,
                    format!("Disallowed command '{cmd}' in update state '{state}'"),
                )
            }
        }
        status.recent = Some(CommandResult {
            cmd_type: cmd,
            ok,
            timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            stderr,
        });
        if self.status.is_none() {
            self.status = Some(UpdateStatus {
                recent: None,
                ..status.clone()
            });
            // The parent creates the status file before forking (main.rs
            // initialize_update_status): it reads Idle until the child ends.
            let s = self.status.as_mut().expect("set");
            s.state = "Idle";
            s.available.clear();
            s.chosen = None;
        }
        self.running = Some(Running {
            until: now + takes,
            status,
            disk,
        });
        (204, String::new())
    }

    /// Whether this action fails now (spending one failure of `fails`).
    fn failing(fails: &mut Option<Fails>) -> Option<Failure> {
        let f = fails.as_mut()?;
        if f.times == 0 {
            return None;
        }
        if f.times != usize::MAX {
            f.times -= 1;
        }
        Some(f.how)
    }

    /// updog's stderr for `how` (main.rs main_inner prints the error; the
    /// metadata is loaded before "Starting update to V", the image after).
    fn failure_text(&self, how: Failure, writing: Option<&Version>) -> String {
        let repo = format!(
            "https://updates.bottlerocket.aws/2020-07-07/{}/{}",
            self.variant, self.arch
        );
        match (how, writing) {
            (Failure::Unreachable, _) | (Failure::Download, None) => format!(
                "Metadata error: Failed to fetch {repo}/timestamp.json: error sending request: \
                 connection closed before message completed\n"
            ),
            (Failure::Expired, _) => "Metadata error: timestamp metadata is expired\n".into(),
            (Failure::Download, Some(v)) => format!(
                "Starting update to {v}\nFailed writing update data to disk: Failed to fetch \
                 https://updates.bottlerocket.aws/targets/bottlerocket-{}-{}-{v}-root.ext4.lz4: \
                 connection reset by peer (os error 104)\n",
                self.variant, self.arch
            ),
        }
    }

    /// The node reboots: into the set the partition flags choose.
    fn reboot(&mut self, now: Instant) {
        // The bootloader takes the set signpost's flags name (disk.rs).
        let booted = self.disk.boot();
        self.boots.push(booted);
        // /run is a tmpfs: no status file, no lock; updog.toml is rendered at boot.
        self.status = None;
        self.running = None;
        self.locked_until = None;
        self.render_at = None;
        self.render_waits = None;
        self.updog = self.datastore.clone();
        self.down_until = Some(now + self.reboot_downtime);
    }

    fn handle(&mut self, method: &str, uri: &str, body: &[u8]) -> (u16, String) {
        let now = Instant::now();
        self.settle(now);
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        let tx = param("tx").unwrap_or_else(|| "default".into());
        match (method, path) {
            ("GET", "/os") => (200, self.os().to_string()),
            ("GET", "/") => {
                // get.rs get_prefixes: GET /?prefix=a.b -> {"a": {"b": ...}}.
                let Some(prefix) = param("prefix") else {
                    return (400, "Missing prefix".into());
                };
                let all = json!({ "os": self.os(), "settings": self.settings() });
                let parts: Vec<&str> = prefix.split('.').collect();
                let mut found = &all;
                for p in &parts {
                    match found.get(p) {
                        Some(x) => found = x,
                        None => return (200, "{}".into()),
                    }
                }
                let mut out = found.clone();
                for p in parts.iter().rev() {
                    out = json!({ *p: out });
                }
                (200, out.to_string())
            }
            ("GET", "/settings") => (200, self.settings().to_string()),
            ("PATCH", "/settings") => match serde_json::from_slice::<Value>(body) {
                Ok(Value::Object(m)) => {
                    merge(
                        self.pending.entry(tx).or_insert(json!({})),
                        Value::Object(m),
                    );
                    (204, String::new())
                }
                _ => (400, "Unable to deserialize input JSON".into()),
            },
            ("PATCH", "/settings/keypair") if self.disk.running() >= KEYPAIR_SINCE => {
                // mod.rs patch_settings_key_pair + massage_set_input.
                let Ok(req) = serde_json::from_slice::<Value>(body) else {
                    return (400, "Unable to deserialize input JSON".into());
                };
                let mut tree = json!({});
                for kv in req["request_payload"].as_array().into_iter().flatten() {
                    let Some((k, val)) = kv.as_str().and_then(|s| s.split_once('=')) else {
                        return (400, format!("Invalid key pair {kv}"));
                    };
                    let val = match val {
                        "true" => json!(true),
                        "false" => json!(false),
                        s => json!(s),
                    };
                    let mut leaf = val;
                    for seg in k.trim_start_matches("settings.").rsplit('.') {
                        leaf = json!({ seg: leaf });
                    }
                    merge(&mut tree, leaf);
                }
                merge(self.pending.entry(tx).or_insert(json!({})), tree);
                (204, String::new())
            }
            ("POST", "/tx/commit_and_apply") => {
                let Some(change) = self.pending.remove(&tx) else {
                    return (422, "Commit with no pending changes".into());
                };
                let lost = self.lost_commit_answers > 0;
                self.lost_commit_answers = self.lost_commit_answers.saturating_sub(1);
                let u = &change["updates"];
                if let Some(lock) = u["version-lock"].as_str() {
                    self.datastore.version_lock = lock.to_string();
                }
                if let Some(w) = u["ignore-waves"].as_bool() {
                    self.datastore.ignore_waves = w;
                }
                // controller.rs apply_changes: thar-be-settings --daemon renders
                // the files after the API answered.
                match self.render_gate {
                    Some(_) => self.render_waits = Some((0, self.datastore.clone())),
                    None => {
                        self.render_at = Some((now + self.settings_delay, self.datastore.clone()))
                    }
                }
                if lost {
                    // Committed, but the answer never reaches the client.
                    return (ANSWER_LOST, String::new());
                }
                (
                    200,
                    json!([
                        "settings.updates.version-lock",
                        "settings.updates.ignore-waves"
                    ])
                    .to_string(),
                )
            }
            ("GET", "/updates/status") => {
                // mod.rs get_update_status: try_lock_shared -> 423 while an
                // action runs; no status file yet -> 404.
                if self.lock_held() {
                    return (423, "Unable to obtain shared lock".into());
                }
                match &self.status {
                    Some(s) => (200, self.status_json(s).to_string()),
                    None => (404, "Uninitialized update status".into()),
                }
            }
            ("POST", "/actions/refresh-updates") => self.dispatch("refresh", now),
            ("POST", "/actions/prepare-update") => self.dispatch("prepare", now),
            ("POST", "/actions/activate-update") => self.dispatch("activate", now),
            ("POST", "/actions/deactivate-update") => self.dispatch("deactivate", now),
            ("POST", "/actions/reboot") => {
                // mod.rs reboot: since 1.22.0 `systemctl reboot
                // --check-inhibitors=yes`, refused while an inhibitor is
                // held; before, `shutdown -r now`, which ignores it.
                let answer = self.reboot_answer();
                if self.hold_reboot_answer {
                    self.held_answer = Some(answer);
                    return (ANSWER_HELD, String::new());
                }
                answer
            }
            _ => (404, String::new()),
        }
    }

    /// The reboot endpoint's answer (see `handle`).
    fn reboot_answer(&mut self) -> (u16, String) {
        if self.inhibitor && self.disk.running() >= INHIBITORS_SINCE {
            self.reboot_refusals += 1;
            return (
                500,
                "Unable to reboot, exit code: 1, stderr: Call to Reboot failed: \
                 Operation inhibited by \"host-containers\" (PID 1234 \"containerd\", \
                 user root), reason is \"admin shell\"."
                    .into(),
            );
        }
        self.reboot_requests += 1;
        (204, String::new())
    }
}

impl State {
    /// After `request` was answered: start a rendering that waited for it.
    fn answered(&mut self, request: &str, now: Instant) {
        let Some((prefix, nth)) = self.render_gate else {
            return;
        };
        if let Some((seen, cfg)) = self.render_waits.as_mut() {
            if request.starts_with(prefix) {
                *seen += 1;
                if *seen >= nth {
                    let cfg = cfg.clone();
                    self.render_waits = None;
                    self.render_at = Some((now + self.settings_delay, cfg));
                }
            }
        }
    }
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (into, from) => *into = from,
    }
}

/// The simulated node: serves its API until dropped.
pub struct BottlerocketApi {
    socket: PathBuf,
    state: Arc<(Mutex<State>, Condvar)>,
    stop: Arc<AtomicBool>,
    server: Option<thread::JoinHandle<()>>,
}

impl BottlerocketApi {
    /// Serve `scenario` on a socket in `dir`.
    pub fn start(dir: &Path, scenario: Scenario) -> Self {
        let socket = dir.join("api.sock");
        let now = Instant::now();
        let lock = UpdogConfig {
            version_lock: "latest".into(),
            ignore_waves: false,
        };
        let mut state = State {
            arch: "x86_64".into(),
            variant: "aws-k8s-1.31".into(),
            releases: scenario.releases,
            datastore: lock.clone(),
            pending: BTreeMap::new(),
            updog: lock,
            render_at: None,
            settings_delay: scenario.settings_delay,
            render_gate: scenario.render_after,
            render_waits: None,
            takes: [
                scenario.refresh_takes,
                scenario.prepare_takes,
                scenario.activate_takes,
            ],
            status: None,
            running: None,
            locked_until: (!scenario.locked_at_start.is_zero())
                .then(|| now + scenario.locked_at_start),
            refusals_left: scenario.locked_for_refusals,
            disk: Disk::new(scenario.running, scenario.inactive),
            inhibitor: scenario.inhibitor,
            refresh_fails: scenario.refresh_fails,
            prepare_fails: scenario.prepare_fails,
            lost_commit_answers: scenario.lost_commit_answers,
            hold_reboot_answer: scenario.hold_reboot_answer,
            reboot_released: false,
            held_answer: None,
            reboot_downtime: scenario.reboot_downtime,
            down_until: None,
            reboot_requests: 0,
            reboot_refusals: 0,
            staged: vec![],
            boots: vec![],
            log: vec![],
            log_at: vec![],
        };
        if let Some(stale) = scenario.stale_ready {
            // An earlier attempt prepared and activated `stale`, then stopped.
            state.disk.write_inactive(stale.clone());
            state
                .disk
                .upgrade_to_inactive()
                .expect("a freshly written set can be activated");
            state.staged.push(stale.clone());
            state.status = Some(UpdateStatus {
                state: "Ready",
                available: vec![stale.clone()],
                chosen: Some(stale.clone()),
                staging: Some((stale, true)),
                recent: Some(CommandResult {
                    cmd_type: "activate",
                    ok: true,
                    timestamp: "2026-11-01T00:00:00.000000000Z".into(),
                    stderr: String::new(),
                }),
            });
        }
        let listener = UnixListener::bind(&socket).expect("bind the API socket");
        let state = Arc::new((Mutex::new(state), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let server = {
            let state = state.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let state = state.clone();
                    thread::spawn(move || serve(conn, &state));
                }
            })
        };
        BottlerocketApi {
            socket,
            state,
            stop,
            server: Some(server),
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait (at most `limit`) until `f` holds of the state, re-checked on every request.
    fn await_state(&self, limit: Duration, what: &str, f: impl Fn(&State) -> bool) {
        let deadline = Instant::now() + limit;
        let mut s = self.lock();
        loop {
            s.settle(Instant::now());
            if f(&s) {
                return;
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("timed out waiting for {what}; requests: {:#?}", s.log));
            // Woken by every request; the timeout also lets an action's end be seen.
            let wait = left.min(Duration::from_millis(50));
            s = self
                .state
                .1
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Wait until the update state is `state`.
    pub fn await_update_state(&self, limit: Duration, state: &str) {
        self.await_state(limit, state, |s| {
            s.running
                .as_ref()
                .map(|r| r.status.state)
                .or(s.status.as_ref().map(|st| st.state))
                == Some(state)
        });
    }

    /// Wait until at least `n` requests were served.
    pub fn await_requests(&self, limit: Duration, n: usize) {
        self.await_state(limit, &format!("{n} requests"), |s| s.log.len() >= n);
    }

    /// The node reboots now (its shutdown has stopped the driver's pod).
    pub fn reboot_now(&self) {
        let mut s = self.lock();
        s.reboot(Instant::now());
    }

    /// The version the node runs.
    pub fn running(&self) -> Version {
        self.lock().disk.running()
    }

    /// The inactive partition set: what it holds and its flags.
    pub fn inactive(&self) -> PartitionSet {
        self.await_state(Duration::from_secs(30), "the running action to end", |s| {
            s.running.is_none()
        });
        self.lock().disk.inactive().clone()
    }

    /// `signpost rollback-to-inactive` from a root shell on the node (the
    /// manual way back; the update API has no such action): its error, as
    /// signpost prints it, when it refuses.
    pub fn signpost_rollback_to_inactive(&self) -> Result<(), String> {
        self.lock().disk.rollback_to_inactive()
    }

    /// `updog.toml` rendered now, as the commit's background rendering
    /// finally does (a test's `settings_delay` that never ended).
    pub fn render_now(&self) {
        let mut s = self.lock();
        s.updog = s.datastore.clone();
        s.render_at = None;
        s.render_waits = None;
    }

    /// From now on, the next `times` prepares fail as `how` says.
    pub fn fail_prepares(&self, how: Failure, times: usize) {
        self.lock().prepare_fails = Some(Fails { how, times });
    }

    /// Let a held reboot answer go ([`Scenario::hold_reboot_answer`]).
    pub fn release_reboot(&self) {
        self.lock().reboot_released = true;
        self.state.1.notify_all();
    }

    /// Wait until the reboot was asked for (its answer may be held).
    pub fn await_reboot_request(&self, limit: Duration) {
        self.await_state(limit, "a reboot request", |s| {
            s.reboot_requests + s.reboot_refusals > 0
        });
    }

    /// Every image updog wrote to the staging partition.
    pub fn staged(&self) -> Vec<Version> {
        self.lock().staged.clone()
    }

    /// Every version booted since the start.
    pub fn boots(&self) -> Vec<Version> {
        self.lock().boots.clone()
    }

    /// `settings.updates.version-lock` as the API's datastore holds it.
    pub fn version_lock(&self) -> String {
        self.lock().datastore.version_lock.clone()
    }

    /// How many reboots were requested and accepted.
    pub fn reboot_requests(&self) -> usize {
        self.lock().reboot_requests
    }

    /// The update state once pending work is done ("Idle" before any command),
    /// and whether the staging partition is marked to boot next.
    pub fn update_state(&self) -> (String, bool) {
        self.await_state(Duration::from_secs(30), "the running action to end", |s| {
            s.running.is_none()
        });
        let s = self.lock();
        let state = s.status.as_ref().map(|st| st.state).unwrap_or("Idle");
        (state.to_string(), s.disk.inactive_is_next())
    }

    /// Requests served so far, as "METHOD URI -> STATUS".
    pub fn requests(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// Requests served so far, each with when it was served.
    pub fn timed_requests(&self) -> Vec<(Instant, String)> {
        let s = self.lock();
        s.log_at
            .iter()
            .copied()
            .zip(s.log.iter().cloned())
            .collect()
    }
}

impl Drop for BottlerocketApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop, if the socket is still there; the thread is
        // not joined, so a removed socket cannot hang the test.
        let _ = UnixStream::connect(&self.socket);
        drop(self.server.take());
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One HTTP/1.1 exchange (curl sends one request per connection here).
fn serve(conn: UnixStream, state: &(Mutex<State>, Condvar)) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if head.len() + line.len() > MAX_REQUEST {
            return;
        }
        if let Some((k, val)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = val.trim().parse().unwrap_or(0);
            }
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        head.push_str(&line);
    }
    if length > MAX_REQUEST {
        return;
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let mut words = head.split_whitespace();
    let (method, uri) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (lock, cvar) = state;
    let answer = {
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.down_until.is_some_and(|t| now < t) {
            // Rebooting: the API server is not up yet; the connection drops.
            s.log
                .push(format!("{method} {uri} -> no answer (rebooting)"));
            s.log_at.push(now);
            None
        } else {
            let (code, text) = s.handle(method, uri, &body);
            s.answered(&format!("{method} {uri}"), now);
            if code == 423 && s.refusals_left > 0 && s.running.is_none() {
                s.refusals_left -= 1;
            }
            let shown = match code {
                ANSWER_LOST => "applied, answer lost".to_string(),
                ANSWER_HELD => "204 (held)".to_string(),
                c => c.to_string(),
            };
            s.log.push(format!("{method} {uri} -> {shown}"));
            s.log_at.push(now);
            Some((code, text))
        }
    };
    cvar.notify_all();
    let Some((mut code, mut text)) = answer else {
        return;
    };
    match code {
        ANSWER_LOST => return,
        ANSWER_HELD => {
            // Answered once the test lets it go (or the node reboots).
            let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
            let deadline = Instant::now() + Duration::from_secs(60);
            while !s.reboot_released && Instant::now() < deadline {
                s = cvar
                    .wait_timeout(s, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            (code, text) = s.held_answer.take().unwrap_or((204, String::new()));
        }
        _ => {}
    }
    let reason = match code {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        423 => "Locked",
        _ => "Internal Server Error",
    };
    let mut out = conn;
    let _ = write!(
        out,
        "HTTP/1.1 {code} {reason}\r\ncontent-length: {}\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
}
