//! Trust (DESIGN §6): SSH commit signatures against an allowed-signers file, and ancestry checks.
