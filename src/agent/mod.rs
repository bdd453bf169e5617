//! The in-cluster agent: source → trust → config → gate → window → engine → status, on every trigger.
