//! The audit trail: version changes from git history, with signers and confirmations (`drover log`).
