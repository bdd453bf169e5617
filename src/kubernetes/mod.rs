//! The Kubernetes implementation of the cluster interface: observe, cordon, drain, OS update drivers.
