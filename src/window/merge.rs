//! The merge of a calendar's raw windows into the windows people and the
//! rollout are told: one sweep over the raw windows in start order
//! ([`Sweep`]), exact except where it cuts a window ([`super::HORIZON`],
//! [`super::MAX_MERGED_FIRINGS`]) and says so, and the look back for the
//! start of the window open at an instant ([`Calendar::began`]).

use super::{Calendar, Window, MAX_MERGED_FIRINGS};
use chrono::{DateTime, Utc};

/// The union of raw windows (start, end) given in start order, from a
/// floor on: its open stretches, the first clipped at the floor, each
/// exact except where cut, after [`MAX_MERGED_FIRINGS`] raw windows or
/// [`super::HORIZON`] past its start. A cut stretch `continues`, and the next one
/// starts at the cut: the union is open there (a raw window covers it).
pub(super) struct Sweep<I: Iterator<Item = (DateTime<Utc>, DateTime<Utc>)>> {
    raw: std::iter::Peekable<I>,
    /// Nothing before this is listed (the floor, then each stretch's end).
    floor: DateTime<Utc>,
    /// How far the raw windows taken so far reach past the last cut.
    carry: Option<DateTime<Utc>>,
    /// How long one stretch is followed before it is cut.
    horizon: chrono::Duration,
}

impl<I: Iterator<Item = (DateTime<Utc>, DateTime<Utc>)>> Iterator for Sweep<I> {
    type Item = Window;

    fn next(&mut self) -> Option<Window> {
        let (start, mut end) = match self.carry.take() {
            Some(reach) => (self.floor, reach),
            None => loop {
                let (s, e) = self.raw.next()?;
                if e > self.floor {
                    break (s.max(self.floor), e);
                }
            },
        };
        let limit = start
            .checked_add_signed(self.horizon)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let mut taken = 1;
        let mut continues = false;
        loop {
            if end > limit {
                self.carry = Some(end);
                end = limit;
                continues = true;
                break;
            }
            match self.raw.peek().copied() {
                Some((s, e)) if s <= end => {
                    if taken >= MAX_MERGED_FIRINGS && s > start {
                        // Cut where the next raw window starts: open there.
                        self.carry = Some(end);
                        end = s;
                        continues = true;
                        break;
                    }
                    end = end.max(e);
                    self.raw.next();
                    taken += 1;
                }
                _ => break,
            }
        }
        self.floor = end;
        Some(Window {
            start,
            end,
            opened_earlier: false,
            continues,
        })
    }
}

impl Calendar {
    /// The union of the raw windows from `from` on, as [`Sweep`] cuts it:
    /// the first stretch clipped at `from`.
    pub(super) fn sweep(
        &self,
        from: DateTime<Utc>,
    ) -> Sweep<impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)> + '_> {
        // Raw windows that reach past `from` start after `from - longest`.
        let back = from.checked_sub_signed(self.longest).unwrap_or(from);
        Sweep {
            raw: self.raw_after(back).peekable(),
            floor: from,
            carry: None,
            horizon: self.horizon,
        }
    }

    /// Where the open stretch holding `t` began, looked for at most
    /// [`super::HORIZON`] and [`MAX_MERGED_FIRINGS`] raw windows back, and whether
    /// it was open before that too (the search stopped before its start).
    /// The caller knows the union is open at `t`.
    pub(super) fn began(&self, t: DateTime<Utc>) -> (DateTime<Utc>, bool) {
        let floor = t.checked_sub_signed(self.horizon).unwrap_or(t);
        let chunk = (self.longest * 2).max(chrono::Duration::days(1));
        let mut s = t;
        let mut budget = MAX_MERGED_FIRINGS;
        loop {
            let lo = s
                .checked_sub_signed(chunk)
                .unwrap_or(DateTime::<Utc>::MIN_UTC)
                .max(floor.checked_sub_signed(self.longest).unwrap_or(floor));
            // The raw windows starting in (lo, s], joined in start order:
            // only the last stretch can reach `s` (stretches are disjoint).
            let mut last: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
            for (start, end) in self.raw_after(lo) {
                if start > s {
                    break;
                }
                if budget == 0 {
                    return (s, true);
                }
                budget -= 1;
                last = match last {
                    Some((a, b)) if start <= b => Some((a, b.max(end))),
                    _ => Some((start, end)),
                };
            }
            match last {
                Some((a, b)) if b >= s && a < s => {
                    s = a;
                    // A raw window starting at or before `lo` ends by
                    // `lo + longest`: none reaches a stretch starting later.
                    if lo
                        .checked_add_signed(self.longest)
                        .is_none_or(|reach| a > reach)
                    {
                        return (s, false);
                    }
                    if s <= floor {
                        return (s, true);
                    }
                }
                _ => return (s, false),
            }
        }
    }
}
