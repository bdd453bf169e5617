//! `kubelet-sim`: simulated nodes for a kube-apiserver that has no kubelets and no
//! controller-manager. The library behind it is `tests/support/kubelet.rs`.

#[path = "../tests/support/kubelet.rs"]
mod kubelet;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};

use kubelet::{Fault, Kubelet, KubeletOptions, SimEvent};

const ABOUT: &str = "Simulated Kubernetes nodes for drover's tests and demos.

Registers Nodes (Ready, with nodeInfo.osImage from --os-image at --version) and keeps
their Leases fresh; makes Pending pods bound to them Running and Ready and finishes the
deletion of their terminating pods after the grace period; keeps PodDisruptionBudget
status as the disruption controller would, so evictions are allowed or refused (429)
by the API server for real; and runs drover's upgrade Jobs by rebooting the node.

Upgrade Job contract: a Job labelled app.kubernetes.io/managed-by=drover,
drover.dev/node=<node>, drover.dev/target-version=<semver>, whose pod template has
spec.nodeName=<node>. The node goes NotReady (reason KubeletNotReady, \"rebooting for
OS update\") for --reboot, comes back Ready at the target version, and the Job is marked
complete (succeeded=1, conditions SuccessCriteriaMet and Complete). A Job for a node
already at the version completes at once. No pods are created for Jobs, unless
--graceful-shutdown is given: then the Job's pods are created, the node shuts down
gracefully before the reboot (killing the pod, rejecting new ones) and the Job's
podFailurePolicy and backoffLimit decide, as the Job controller would.

Runs until interrupted (Ctrl-C), then deletes its nodes unless --keep-nodes.";

const EXAMPLES: &str = "Examples:
  cargo run --example kubelet-sim -- --kubeconfig DIR/kubeconfig --nodes 6 \\
      --os-image 'Bottlerocket OS {version} (aws-k8s-1.36)' --version 1.12.0 --reboot 3s \\
      --labels node-role.kubernetes.io/worker=
  cargo run --example kubelet-sim -- --kubeconfig K --nodes 3 \\
      --fault sim-1=never-ready --fault sim-2=version:1.11.0 --grace-cap 2s
  cargo run --example kubelet-sim -- --kubeconfig K --nodes 3 \\
      --fault sim-1=crashloop-after-upgrade --fault sim-2=condition:MemoryPressure";

#[derive(Parser, Debug)]
#[command(name = "kubelet-sim", about = ABOUT, after_help = EXAMPLES)]
struct Args {
    /// Kubeconfig of an identity allowed to manage nodes, leases, pods, jobs and PDB status.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Number of nodes to register.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Node names are PREFIX0, PREFIX1, ...
    #[arg(long, default_value = "sim-")]
    name_prefix: String,
    /// nodeInfo.osImage; {version} is replaced by the node's OS version.
    #[arg(long, default_value = "Bottlerocket OS {version} (aws-k8s-1.36)")]
    os_image: String,
    /// OS version the nodes start at.
    #[arg(long, default_value = "1.0.0")]
    version: String,
    /// nodeInfo.kubeletVersion.
    #[arg(long, default_value = "v1.36.3")]
    kubelet_version: String,
    /// Extra node labels, KEY=VALUE (VALUE may be empty); repeatable or comma-separated.
    #[arg(long = "labels", value_delimiter = ',')]
    labels: Vec<String>,
    /// How long an upgrade keeps a node NotReady (e.g. 3s, 1m).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    reboot: Duration,
    /// Multiply pods' termination grace periods by this.
    #[arg(long, default_value_t = 1.0)]
    grace_scale: f64,
    /// Never wait longer than this for a terminating pod (pods annotated
    /// sim.drover.dev/slow-termination: "<seconds>" wait that long regardless).
    #[arg(long, value_parser = humantime::parse_duration)]
    grace_cap: Option<Duration>,
    /// Lease renewal interval.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_interval: Duration,
    /// Node status heartbeat interval.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    status_interval: Duration,
    /// Fault for one node, NODE=KIND with KIND one of never-ready, old-version,
    /// version:X.Y.Z, job-fails, crashloop-after-upgrade (its pods crash-loop
    /// once it returns from an upgrade), crashloop-at:X.Y.Z (the same, only at
    /// that version) or condition:TYPE (node condition TYPE,
    /// such as MemoryPressure, turns True once it returns); repeatable.
    #[arg(long = "fault")]
    faults: Vec<String>,
    /// Do not play the disruption controller (leave PDB status alone).
    #[arg(long)]
    no_pdb_controller: bool,
    /// Only manage PDBs in this namespace (default: all namespaces).
    #[arg(long)]
    pdb_namespace: Option<String>,
    /// Leave the nodes registered on exit.
    #[arg(long)]
    keep_nodes: bool,
    /// Play the kubelet's graceful node shutdown for this long before each
    /// reboot (killed pods marked DisruptionTarget, new ones rejected with
    /// NodeShutdown) and the Job controller for upgrade Jobs: their pods are
    /// created and judged by the Job's podFailurePolicy and backoffLimit.
    #[arg(long, value_parser = humantime::parse_duration)]
    graceful_shutdown: Option<Duration>,
    /// The Job controller's pod failure backoff, doubled per failure.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    job_backoff: Duration,
    /// How long downloading an update takes (a prepare Job, or an upgrade
    /// Job that finds nothing staged), e.g. 30s.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    download: Duration,
}

fn parse_labels(raw: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    raw.iter()
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("--labels {l:?}: expected KEY=VALUE"),
        })
        .collect()
}

fn parse_faults(raw: &[String]) -> anyhow::Result<Vec<(String, Fault)>> {
    raw.iter()
        .map(|f| {
            let (node, kind) = f
                .split_once('=')
                .with_context(|| format!("--fault {f:?}: expected NODE=KIND"))?;
            Ok((node.to_string(), kind.parse()?))
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kubelet_sim=info".into()),
        )
        .init();
    let args = Args::parse();
    let opts = KubeletOptions {
        name_prefix: args.name_prefix.clone(),
        nodes: args.nodes,
        os_image: args.os_image.clone(),
        version: args.version.clone(),
        kubelet_version: args.kubelet_version.clone(),
        labels: parse_labels(&args.labels)?,
        reboot: args.reboot,
        grace_scale: args.grace_scale,
        grace_cap: args.grace_cap,
        lease_interval: args.lease_interval,
        status_interval: args.status_interval,
        pdb_controller: !args.no_pdb_controller,
        pdb_namespace: args.pdb_namespace.clone(),
        remove_nodes_on_shutdown: !args.keep_nodes,
        graceful_shutdown: args.graceful_shutdown,
        job_backoff: args.job_backoff,
        download: args.download,
        driver: None,
    };
    let faults = parse_faults(&args.faults)?;

    let kc = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;

    // Faults first, so not even the first upgrade escapes them.
    let sim = Kubelet::start(
        client,
        KubeletOptions {
            nodes: 0,
            ..opts.clone()
        },
    )
    .await?;
    for (node, fault) in faults {
        sim.set_fault(&node, fault);
    }
    let names = sim.add_nodes(opts.nodes).await?;
    println!(
        "kubelet-sim: {} node(s) Ready at {}: {}",
        names.len(),
        opts.version,
        names.join(" ")
    );

    let mut events = sim.subscribe();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            event = events.recv() => match event {
                Ok(SimEvent::UpgradeStarted { node, target }) => println!("{node}: rebooting into {target}"),
                Ok(SimEvent::NodeReturned { node, version }) => println!("{node}: Ready at {version}"),
                Ok(SimEvent::NodeStaysDown { node }) => println!("{node}: stays NotReady (fault)"),
                Ok(SimEvent::JobCompleted { namespace, job }) => println!("job {namespace}/{job}: complete"),
                Ok(SimEvent::JobFailed { namespace, job, reason }) => println!("job {namespace}/{job}: failed ({reason})"),
                Ok(SimEvent::PodTerminated { namespace, pod }) => println!("pod {namespace}/{pod}: terminated"),
                Ok(SimEvent::PodRejected { namespace, pod, reason }) => println!("pod {namespace}/{pod}: rejected ({reason})"),
                Err(_) => {}
            },
        }
    }
    println!("kubelet-sim: stopping");
    sim.shutdown().await;
    Ok(())
}
