//! Status reports (DESIGN §5): `status/<env>/<cluster>.toml` on the status branch.
