//! The narrow interface the rollout engine drives, implemented by the Kubernetes backend and the simulation.
