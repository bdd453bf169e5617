//! The fleet at a glance (`drover status`, `drover demo --html`): where
//! every environment and cluster is now, when the next window opens, and
//! what the gate would answer for the next promotion.
//!
//! [`model`] holds plain values; [`gather`] fills them from the config, the
//! windows, the gate and the status branch (read through [`reports`]);
//! [`text`] and [`html`] render them without any I/O.

pub mod gather;
pub mod html;
pub mod model;
pub mod reports;
pub mod text;

pub use gather::{gather, timeline, Error};
pub use model::*;
