//! An in-memory simulated cluster with a virtual clock, for `drover demo`, `drover plan` and benchmarks.
