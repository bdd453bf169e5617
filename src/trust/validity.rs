//! When a listed key may sign: its window, from the allowed-signers line
//! (`valid-after`, `valid-before`) or from the OpenPGP key itself
//! (creation, expiry, revocation), checked both at the time a commit claims
//! and when the commit was first seen.

use super::{Reason, SignerEntry};

/// When a listed key may sign, from its list entry or from the key itself.
pub(super) struct Validity {
    pub(super) principal: String,
    pub(super) after: Option<Bound>,
    pub(super) before: Option<Bound>,
}

/// One end of a key's validity.
pub(super) struct Bound {
    pub(super) at: i64,
    pub(super) limit: Limit,
}

/// What sets a [`Bound`].
pub(super) enum Limit {
    ValidAfter,
    ValidBefore,
    Created,
    Expires,
    /// A soft OpenPGP revocation (superseded, retired), with its reason.
    Revoked(String),
}

impl Bound {
    fn describe(&self) -> String {
        match &self.limit {
            Limit::ValidAfter => "valid-after".into(),
            Limit::ValidBefore => "valid-before".into(),
            Limit::Created => format!("OpenPGP key created {}", rfc3339(self.at)),
            Limit::Expires => format!("OpenPGP key expired {}", rfc3339(self.at)),
            Limit::Revoked(why) => why.clone(),
        }
    }

    /// The refusal for a time at or past this end; `seen` when that time is the first sighting.
    fn passed(&self, principal: &str, seen: Option<i64>) -> Reason {
        let principal = principal.to_string();
        match (&self.limit, seen) {
            (Limit::Revoked(why), None) => Reason::Revoked {
                principal,
                detail: format!(
                    "was revoked ({why}) at {}, before the commit time",
                    rfc3339(self.at)
                ),
            },
            (Limit::Revoked(why), Some(s)) => Reason::Revoked {
                principal,
                detail: format!(
                    "was revoked ({why}) at {}, before the commit was first seen at {}",
                    rfc3339(self.at),
                    rfc3339(s)
                ),
            },
            (_, None) => Reason::Expired {
                principal,
                limit: self.describe(),
            },
            (_, Some(s)) => Reason::ExpiredWhenSeen {
                principal,
                seen: rfc3339(s),
                limit: self.describe(),
            },
        }
    }
}

impl Validity {
    /// Whether the key was valid over `claimed` (the earliest and latest
    /// time the signer states) and at `seen`, when the commit was first seen.
    pub(super) fn judge(&self, claimed: (i64, i64), seen: Option<i64>) -> Result<(), Reason> {
        let principal = || self.principal.clone();
        if let Some(a) = self.after.as_ref().filter(|a| claimed.0 < a.at) {
            return Err(Reason::NotYetValid {
                principal: principal(),
                limit: a.describe(),
            });
        }
        if let Some(b) = self.before.as_ref().filter(|b| claimed.1 >= b.at) {
            return Err(b.passed(&self.principal, None));
        }
        let Some(s) = seen else { return Ok(()) };
        if let Some(a) = self.after.as_ref().filter(|a| s < a.at) {
            return Err(Reason::NotYetValidWhenSeen {
                principal: principal(),
                seen: rfc3339(s),
                limit: a.describe(),
            });
        }
        if let Some(b) = self.before.as_ref().filter(|b| s >= b.at) {
            return Err(b.passed(&self.principal, Some(s)));
        }
        Ok(())
    }
}

impl SignerEntry {
    pub(super) fn validity(&self) -> Validity {
        Validity {
            principal: self.principal(),
            after: self.valid_after.map(|at| Bound {
                at,
                limit: Limit::ValidAfter,
            }),
            before: self.valid_before.map(|at| Bound {
                at,
                limit: Limit::ValidBefore,
            }),
        }
    }
}

pub(super) fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}
