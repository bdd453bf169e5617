//! The git source: fetching the config repository and reading it at a commit.
