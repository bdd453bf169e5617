//! The promotion gate (DESIGN §4): may an environment take a version, given the evidence from the one below.
