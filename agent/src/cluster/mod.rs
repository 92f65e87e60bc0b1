//! Cluster mode (`qoslet run --kube`): qoslet as the node agent of a Kubernetes cluster, beside
//! the kubelet.
//!
//! [`source`] watches the node's pods and their workload objects through the API server;
//! [`executor`] finds the cgroups the kubelet and the container runtime made (qoslet starts
//! nothing, creates no cgroup, and writes only the areas `enforce` lists); [`action`] evicts as
//! the kubelet's eviction manager does (the local kill, then phase Failed, reason Evicted on
//! `pods/status`), with [`unit`] naming a unit's members on other nodes, and tells the API server
//! through [`queue`], which survives the API server's absence and qoslet's restarts and delivers
//! each [`writes::ApiWrite`] as one typed kube call; [`report`] keeps qoslet's node conditions,
//! events, taint and lease. [`run`] wires them into the mode-independent [`crate::node`].
//!
//! Data flows one way: `source` → `unit` → `action` → `queue` → `writes`; `report` →
//! `queue`. No module reads back from one downstream of it.

pub(crate) mod action;
pub mod client;
pub(crate) mod discover;
pub(crate) mod executor;
pub mod marks;
pub(crate) mod queue;
pub(crate) mod report;
pub(crate) mod review;
pub(crate) mod source;
pub(crate) mod unit;
pub(crate) mod writes;

#[cfg(test)]
mod mock;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kube::{Client, config::KubeConfigOptions};
use thiserror::Error;

pub(crate) use action::ApiEviction;
pub(crate) use executor::KubeletExecutor;
pub(crate) use source::{ApiSource, SourceClosed};

use crate::{
    cgroup::ContainerRuntime,
    config::{CapacityOverride, KUBELET_API_VERSION, KubeletConfig},
    exit,
    node::{self, ModeStart, NodeError, PodSource, StartError},
    policy::{settings::Capacity, version::KubeVersion},
    source::{Diff, PodSet},
};

/// Where the kubelet's configuration comes from.
#[derive(Debug, Clone)]
pub enum KubeletConfigFrom {
    /// A file (the kubelet's own, mounted read-only).
    File(PathBuf),
    /// A file of the host's named through the host-root mount (`--kubelet-config
    /// /host/var/lib/kubelet/config.yaml` with `--host-root /host`): read inside `root`, so an
    /// absolute symlink such as `config.yaml -> /etc/kubernetes/kubelet.yaml` resolves on the
    /// host, not in qoslet's container.
    FileInRoot { root: PathBuf, path: PathBuf },
    /// The kubelet's `/configz` through the API server's node proxy.
    Configz,
    /// The running kubelet's command line and files ([`discover`]); its files are read beneath
    /// `host_root` when its own root is closed to qoslet.
    Discover { host_root: Option<PathBuf> },
}

/// How the cluster node was asked to run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub kubelet_config: KubeletConfigFrom,
    pub config: Option<PathBuf>,
    pub node_name: String,
    /// A kubeconfig; without it, `KUBECONFIG`, `~/.kube/config` or the in-cluster service
    /// account (kube's inference).
    pub kubeconfig: Option<PathBuf>,
    pub observe: bool,
    pub shutdown_grace: Duration,
}

#[derive(Debug, Error)]
pub enum ClusterError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("no node name: pass --node-name or set NODE_NAME")]
    NodeName,
    #[error("cannot build the API client")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot read the kubelet's configuration from /api/v1/nodes/{node}/proxy/configz")]
    Configz {
        node: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the API watchers stopped before the first list")]
    Source(#[from] SourceClosed),
    #[error("cannot open the API write queue")]
    Queue(#[from] queue::QueueError),
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl ClusterError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Start(e) => e.exit_code(),
            Self::NodeName | Self::Client(_) => exit::CONFIG,
            Self::Configz { .. } | Self::Source(_) => exit::UNAVAILABLE,
            Self::Queue(_) => exit::OSERR,
            Self::Node(e) => e.exit_code(),
        }
    }
}

impl PodSource for ApiSource {
    type Error = SourceClosed;

    fn pods(&self) -> &PodSet {
        ApiSource::pods(self)
    }

    fn changed(&mut self) -> impl Future<Output = Result<Diff, SourceClosed>> + Send {
        ApiSource::changed(self)
    }
}

/// The API client: `kubeconfig` when given, else kube's inference; its requests pass `bounds`.
pub async fn client(
    kubeconfig: Option<&Path>,
    bounds: &client::RequestBounds,
) -> Result<Client, ClusterError> {
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| ClusterError::Client(e);
    let config = match kubeconfig {
        Some(f) => {
            let kc = kube::config::Kubeconfig::read_from(f).map_err(|e| boxed(e.into()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| boxed(e.into()))?
        }
        None => kube::Config::infer().await.map_err(|e| boxed(e.into()))?,
    };
    // No retry inside the client: the write queue retries with its own backoff and sorts
    // answers into done, retry and rejected itself ([`client::connect`] leaves kube's retry
    // layer out).
    client::connect(&config, bounds).map_err(|e| boxed(e.into()))
}

/// The kubelet's configuration from `/configz` (`{"kubeletconfig": {...}}`, without apiVersion
/// and kind).
pub(crate) async fn configz(client: &Client, node: &str) -> Result<KubeletConfig, ClusterError> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| ClusterError::Configz {
        node: node.into(),
        source,
    };
    // The one raw request of cluster mode: kube has no typed call for a path behind the node
    // proxy (the kubelet's own endpoint), and `Api::<Node>::get_subresource` would decode the
    // answer as a Node.
    let req = http::Request::get(format!("/api/v1/nodes/{node}/proxy/configz"))
        .body(Vec::new())
        .map_err(|e| err(Box::new(e)))?;
    let text = client
        .request_text(req)
        .await
        .map_err(|e| err(Box::new(e)))?;
    parse_configz(&text).map_err(|e| err(e.into()))
}

pub(crate) fn parse_configz(text: &str) -> Result<KubeletConfig, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut kc = v
        .get("kubeletconfig")
        .cloned()
        .ok_or("no kubeletconfig in the /configz response")?;
    if let Some(m) = kc.as_object_mut() {
        m.entry("apiVersion").or_insert(KUBELET_API_VERSION.into());
        m.entry("kind").or_insert("KubeletConfiguration".into());
    }
    let text = serde_json::to_string(&kc).map_err(|e| e.to_string())?;
    KubeletConfig::parse(Path::new("/configz"), &text).map_err(|e| e.to_string())
}

/// The kubelet's configuration as [`discover`] finds it on this node, with the `/readyz` line
/// that says so. Not found, the kubelet's defaults stand in: observe mode runs (and is ready) on
/// them, but enforce mode falls back to observing and stays not ready, since evicting and
/// writing cgroups by guessed reservations and thresholds is unsafe.
fn discovered(
    start: &mut ModeStart,
    how: discover::Discover<'_>,
) -> (PathBuf, KubeletConfig, (bool, String)) {
    let (proc, host_root) = (how.proc, how.host_root);
    match how.run() {
        Ok(d) => {
            tracing::info!(pid = d.pid, source = %d.source, "Found the kubelet's configuration.");
            if let Some(note) = d.config.ignored_note() {
                tracing::warn!(fields = d.config.ignored.len(), "{note}.");
            }
            (PathBuf::from(&d.source), d.config, (true, d.source))
        }
        Err(e) => {
            let why = e.chain();
            let host = host_root.map_or_else(|| "none".to_owned(), |h| h.display().to_string());
            let enforce = start.enforce();
            tracing::error!(
                error = %why,
                host_root = %host,
                proc = %proc.display(),
                "Could not find the kubelet's configuration (tried: a process named kubelet in the process table, its --config, --config-dir and flags, read beneath its root or --host-root); using the kubelet's defaults. Pass --kubelet-config FILE to name it."
            );
            let detail = if enforce {
                tracing::error!(
                    "Not enforcing with the kubelet's defaults: observing, and not ready."
                );
                start.mode = crate::cgroup::Mode::Observe;
                format!("not found: {why}; observing with the kubelet's defaults, not enforcing")
            } else {
                format!("not found: {why}; observing with the kubelet's defaults")
            };
            (
                PathBuf::from("(the kubelet's defaults)"),
                KubeletConfig::kubelet_defaults(),
                (!enforce, detail),
            )
        }
    }
}

/// The Kubernetes version whose kubelet rules apply: `kubernetesVersion` when the
/// QosletConfiguration sets it (checked when it was read), else the Node's `kubeletVersion`
/// (clamped to 1.34..=1.37 with a warning), else 1.37.
pub(crate) fn kubernetes_version(configured: Option<&str>, kubelet: Option<&str>) -> KubeVersion {
    let of_node = kubelet.map(|k| (k, KubeVersion::of_kubelet(k)));
    if let Some(v) = configured.and_then(|c| c.parse::<KubeVersion>().ok()) {
        if let Some((k, Ok((n, _)))) = of_node
            && n != v
        {
            tracing::info!(kubernetes_version = %v, kubelet_version = k, "kubernetesVersion is set and differs from the node's kubelet; following kubernetesVersion.");
        }
        return v;
    }
    match of_node {
        Some((_, Ok((v, false)))) => v,
        Some((k, Ok((v, true)))) => {
            tracing::warn!(kubelet_version = k, following = %v, "qoslet knows the kubelet rules of 1.34 to 1.37 only; following the nearest. Set kubernetesVersion to choose.");
            v
        }
        Some((k, Err(e))) => {
            tracing::warn!(kubelet_version = k, error = %e, following = %KubeVersion::DEFAULT, "The node's kubeletVersion is not a Kubernetes version; following the default.");
            KubeVersion::DEFAULT
        }
        None => {
            tracing::warn!(following = %KubeVersion::DEFAULT, "The Node reports no kubeletVersion; following the default.");
            KubeVersion::DEFAULT
        }
    }
}

/// Binds `addr` and serves `/healthz` (and `/readyz`, not ready: the pods are not listed yet)
/// on it until the node's server takes the listener over: a liveness probe must not restart
/// qoslet because the API server is away. The listener stays bound throughout, so nothing else
/// can take the port in between.
async fn serve_while_starting(
    addr: SocketAddr,
    auth: Option<Arc<crate::server::auth::Guard>>,
) -> Result<
    (
        std::net::TcpListener,
        Arc<crate::hub::AgentState>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ),
    ClusterError,
> {
    let bind_err =
        |source| ClusterError::Node(NodeError::Bind(crate::server::BindError { addr, source }));
    // A predecessor that just died may hold the port a moment longer: wait a little for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let listener = loop {
        match crate::server::serve::listen(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            bound => {
                break bound
                    .and_then(tokio::net::TcpListener::into_std)
                    .map_err(bind_err)?;
            }
        }
    };
    let early = listener
        .try_clone()
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(bind_err)?;
    let state = Arc::new(crate::hub::AgentState::new(
        Box::new(node::summary::CgroupSummary::new(Default::default(), None)),
        auth,
    ));
    state.readiness.register("api");
    state.readiness.set(
        "api",
        false,
        "waiting for the first list of the node's pods",
    );
    let (_, serve) = crate::server::serve_on(early, state.clone(), Default::default())
        .map_err(|e| ClusterError::Node(NodeError::Bind(e)))?;
    Ok((listener, state, tokio::spawn(serve)))
}

/// The endpoints guarded as `endpointAuth: tokenReview` guards them in [`run`] (an
/// [`review::ApiReviewer`] over `client` for `node`), serving a fresh state whose summary is
/// `node`'s, bound to `addr`. The `endpoint_auth` tests' way in: the server and the hub are
/// the crate's own.
#[doc(hidden)]
pub async fn serve_guarded(
    addr: SocketAddr,
    client: Client,
    node: String,
) -> Result<
    (
        SocketAddr,
        impl Future<Output = std::io::Result<()>> + use<>,
    ),
    crate::server::BindError,
> {
    let summary = node::summary::CgroupSummary::new(Default::default(), Some(node.clone()));
    let state = Arc::new(crate::hub::AgentState::new(
        Box::new(summary),
        Some(Arc::new(crate::server::auth::Guard::new(
            review::ApiReviewer { client, node },
        ))),
    ));
    let listener = crate::server::serve::listen(addr)
        .map_err(|source| crate::server::BindError { addr, source })?;
    crate::server::serve_on(listener, state, Default::default())
}

/// Waits for the first list of the node's pods and Node, saying on `/readyz` (every second)
/// what the watches are doing meanwhile: a list the API server refuses shows its error there.
async fn wait_first_list(
    source: &mut ApiSource,
    early: &crate::hub::AgentState,
) -> Result<(), SourceClosed> {
    let watches = source.watch_states();
    let synced = source.wait_synced();
    tokio::pin!(synced);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            r = &mut synced => return r.map(drop),
            _ = tick.tick() => early.readiness.set(
                "api",
                false,
                format!("waiting for the first list of the node's pods; watches: {}", watches.summary()),
            ),
        }
    }
}

/// What the start-up before the node's loop found: the kubelet's configuration, the node root,
/// and the watches with their first list done.
struct Listed {
    kc_file: PathBuf,
    kc: KubeletConfig,
    /// `/readyz`'s `kubelet` line: ready, and from where the configuration came.
    kubelet_line: (bool, String),
    fs: Arc<crate::cgroup::CgroupFs>,
    source: ApiSource,
}

/// The kubelet's configuration, the node root and the first list of the node's pods and Node,
/// which may wait for good on an API server that is down or silent (and is watched for a signal
/// meanwhile by [`run`]).
async fn until_first_list(
    opts: &ClusterOptions,
    start: &mut ModeStart,
    client: &Client,
    bounds: &client::RequestBounds,
    early_state: &crate::hub::AgentState,
) -> Result<Listed, ClusterError> {
    let (kc_file, kc, kubelet_line) = match &opts.kubelet_config {
        KubeletConfigFrom::File(f) => (
            f.clone(),
            KubeletConfig::load(f).map_err(StartError::from)?,
            (true, format!("from {}", f.display())),
        ),
        KubeletConfigFrom::FileInRoot { root, path } => {
            let shown = root.join(path.strip_prefix("/").unwrap_or(path));
            let kc = discover::load_in_root(root, path, &shown).map_err(StartError::from)?;
            (
                shown.clone(),
                kc,
                (true, format!("from {}", shown.display())),
            )
        }
        KubeletConfigFrom::Configz => {
            let path = format!("/api/v1/nodes/{}/proxy/configz", opts.node_name);
            let kc = configz(client, &opts.node_name).await?;
            (path.clone().into(), kc, (true, format!("from {path}")))
        }
        KubeletConfigFrom::Discover { host_root } => discovered(
            start,
            discover::Discover {
                proc: Path::new("/proc"),
                host_root: host_root.as_deref(),
                node_name: Some(&opts.node_name),
            },
        ),
    };
    let mounts = ModeStart::mounts()?;
    let fs = start.open_root(mounts).map_err(NodeError::NodeRoot)?;
    let validation = node::startup::validation(&kc);

    let mut source = ApiSource::start(
        client.clone(),
        bounds.answered(),
        &opts.node_name,
        validation,
    );
    tracing::info!(node = %opts.node_name, "Waiting for the first list of the node's pods.");
    wait_first_list(&mut source, early_state).await?;
    Ok(Listed {
        kc_file,
        kc,
        kubelet_line,
        fs,
        source,
    })
}

/// Runs the cluster node until SIGINT, SIGTERM or SIGHUP. The kubelet's pods are left running.
/// A signal before the first list (the API server down or silent) stops qoslet there, with
/// nothing written on the node yet.
pub async fn run(
    opts: ClusterOptions,
    capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
) -> Result<(), ClusterError> {
    if opts.node_name.is_empty() {
        return Err(ClusterError::NodeName);
    }
    // First: a signal from here on stops qoslet, before the first list as after it.
    let mut signals = node::Signals::new()?;
    let mut start = ModeStart::load(opts.config.as_deref(), opts.observe, true)?;
    let bounds = client::RequestBounds::default();
    let client = client(opts.kubeconfig.as_deref(), &bounds).await?;
    // `/metrics` and `/stats/summary` ask the API server who is asking, from the first request.
    let auth = (start.endpoint_auth == crate::config::EndpointAuth::TokenReview).then(|| {
        Arc::new(crate::server::auth::Guard::new(review::ApiReviewer {
            client: client.clone(),
            node: opts.node_name.clone(),
        }))
    });
    let (listener, early_state, early) = serve_while_starting(start.addr, auth.clone()).await?;
    let listed = tokio::select! {
        listed = until_first_list(&opts, &mut start, &client, &bounds, &early_state) => listed,
        signal = signals.next() => {
            tracing::info!(signal, "Stopping before the first list of the node's pods: nothing was enforced or written yet.");
            early.abort();
            let _ = early.await;
            return Ok(());
        }
    };
    let listed = listed?;
    // The node's own server takes the listener over.
    early.abort();
    let _ = early.await;
    let node_facts = NodeFacts::of(&listed.source, &opts.node_name);
    let settings = node_settings(
        &mut start,
        &listed,
        node_facts.kubelet_version.as_deref(),
        capacity,
    )?;
    let Listed {
        kc,
        kubelet_line,
        fs,
        source,
        ..
    } = listed;
    let (mut api, action) =
        ApiSide::start(&start, &opts.node_name, &node_facts.uid, &client, &source)?;
    if start.enforce() {
        marks::at_start(
            &fs,
            settings.cgroup_driver,
            source.pods(),
            &action,
            &api.queue,
        );
    }
    let executor = Arc::new(KubeletExecutor::new(node_facts.runtime));
    let qc = &start.qc;
    tracing::info!(node = %opts.node_name, runtime = ?node_facts.runtime, driver = ?settings.cgroup_driver, enforce = ?qc.enforce, eviction_method = ?qc.eviction_method, gang_eviction = ?qc.gang_eviction, "Cluster node: pods from the API server, cgroups from the kubelet.");
    let mut cfg = start.run_config(settings, &kc, fs, node_facts.runtime, opts.shutdown_grace);
    cfg.listener = Some(listener);
    cfg.on_start = Some(api.on_start(kubelet_line));
    cfg.node_name = Some(opts.node_name.clone());
    cfg.auth = auth;
    let result = node::run(cfg, source, executor, action, signals).await;
    api.stop().await;
    result?;
    Ok(())
}

/// What the node's own Node object says that the start needs: the kubelet's version, the
/// container runtime and the Node's uid (the node's name when the Node is not listed yet).
struct NodeFacts {
    kubelet_version: Option<String>,
    runtime: ContainerRuntime,
    uid: String,
}

impl NodeFacts {
    fn of(source: &ApiSource, node_name: &str) -> Self {
        let node = source.node();
        let kubelet_version = node
            .as_deref()
            .and_then(|n| n.status.as_ref()?.node_info.as_ref())
            .map(|i| i.kubelet_version.clone());
        let runtime = node
            .as_deref()
            .and_then(executor::runtime_of_node)
            .unwrap_or_else(|| {
                tracing::warn!(
                    "The Node reports no containerd or CRI-O runtime; assuming containerd."
                );
                ContainerRuntime::Containerd
            });
        let uid = node
            .and_then(|n| n.metadata.uid.clone())
            .unwrap_or_else(|| node_name.to_owned());
        Self {
            kubelet_version,
            runtime,
            uid,
        }
    }
}

/// The node's settings: the kubelet's rules follow its version, which the Node says, unless the
/// configuration names one, so the settings are built once it is known.
fn node_settings(
    start: &mut ModeStart,
    listed: &Listed,
    kubelet_version: Option<&str>,
    capacity: impl FnOnce(&CapacityOverride, Option<i64>) -> Result<Capacity, String>,
) -> Result<crate::policy::settings::NodeSettings, ClusterError> {
    let version = kubernetes_version(start.qc.kubernetes_version.as_deref(), kubelet_version);
    start.qc.kubernetes_version = Some(version.to_string());
    let mut settings = start.settings(&listed.kc_file, &listed.kc, &listed.fs, capacity)?;
    if start.qc.node_root_cgroup.is_some() {
        // The node root stands where the kubelet's cgroupRoot is: its tree (kubepods or
        // kubepods.slice) is found directly beneath it, named as under a cgroupRoot of "/".
        settings.cgroup_root = "/".into();
    }
    Ok(settings)
}

/// The API server's side of the node: the write queue and its delivery (enforce mode only),
/// and the reporter of conditions, events, taint and lease, started with the node's state.
struct ApiSide {
    queue: Arc<queue::WriteQueue>,
    delivery: Option<tokio::task::JoinHandle<()>>,
    reporter: Option<report::Reporter>,
    reporter_task: Option<tokio::sync::oneshot::Receiver<tokio::task::JoinHandle<()>>>,
}

impl ApiSide {
    fn start(
        start: &ModeStart,
        node_name: &str,
        node_uid: &str,
        client: &Client,
        source: &ApiSource,
    ) -> Result<(Self, ApiEviction), ClusterError> {
        let enforce = start.enforce();
        let qc = &start.qc;
        let queue = Arc::new(queue::WriteQueue::open(&qc.state_dir.join("api-writes"))?);
        let delivery = enforce.then(|| {
            let c = client.clone();
            tokio::spawn(queue.clone().run(move |w| {
                let c = c.clone();
                async move { writes::deliver(&c, &w).await }
            }))
        });
        let reporter = report::Reporter {
            client: client.clone(),
            node: node_name.to_owned(),
            node_uid: node_uid.to_owned(),
            lease_namespace: qc.lease_namespace.clone(),
            queue: queue.clone(),
            watches: source.watch_states(),
            gang: source.gang_awareness(),
            write: enforce,
            taint: qc.taint_on_pressure,
        };
        let action = ApiEviction::new(
            queue.clone(),
            node_name,
            qc.eviction_method,
            qc.gang_eviction,
            Some(unit::UnitMembers {
                client: client.clone(),
                pods: source.pod_store(),
            }),
        )
        .with_pod_store(source.pod_store());
        let side = Self {
            queue,
            delivery,
            reporter: Some(reporter),
            reporter_task: None,
        };
        Ok((side, action))
    }

    /// What the node runs once its state exists: `/readyz`'s `kubelet` line, and the reporter
    /// started on that state.
    fn on_start(
        &mut self,
        (ready, detail): (bool, String),
    ) -> Box<dyn FnOnce(Arc<crate::hub::AgentState>) + Send> {
        let reporter = self.reporter.take().expect("on_start is asked for once");
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.reporter_task = Some(rx);
        Box::new(move |state| {
            state.readiness.set("kubelet", ready, detail);
            let _ = tx.send(tokio::spawn(reporter.run(state)));
        })
    }

    /// Stops the reporter and the delivery; writes not delivered by now stay on disk for the
    /// next start.
    async fn stop(self) {
        if let Some(rx) = self.reporter_task
            && let Ok(t) = rx.await
        {
            t.abort();
        }
        if let Some(t) = self.delivery {
            let pending = self.queue.pending().len();
            if pending > 0 {
                tracing::info!(pending, "API writes left for the next start.");
            }
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No kubelet: the kubelet's defaults; observe mode is ready on them, enforce mode observes
    /// and is not ready. Found: ready, naming what was read.
    #[test]
    fn without_a_kubelet_enforce_mode_observes_and_is_not_ready() {
        let at = |proc| discover::Discover {
            proc,
            host_root: None,
            node_name: None,
        };
        let t = mock::TempDir::new("discovered");
        std::fs::create_dir_all(&t.0).unwrap();
        let mut start = ModeStart::load(None, false, true).unwrap();
        assert!(start.enforce());
        let (file, kc, (ready, detail)) = discovered(&mut start, at(&t.0));
        assert!(!start.enforce(), "observing");
        assert!(!ready);
        assert_eq!(file, Path::new("(the kubelet's defaults)"));
        assert_eq!(kc.eviction_hard, None);
        assert_eq!(
            detail,
            format!(
                "not found: no kubelet process in {} (comm and argv[0] named kubelet); observing with the kubelet's defaults, not enforcing",
                t.0.display()
            )
        );

        let mut start = ModeStart::load(None, true, true).unwrap();
        let (_, _, (ready, detail)) = discovered(&mut start, at(&t.0));
        assert!(ready, "observe mode runs on the defaults");
        assert!(detail.starts_with("not found: "), "{detail}");

        let pid = t.0.join("77");
        std::fs::create_dir_all(pid.join("root")).unwrap();
        std::fs::write(pid.join("comm"), "kubelet\n").unwrap();
        std::fs::write(pid.join("cmdline"), "kubelet\0--cgroup-driver=systemd\0").unwrap();
        let mut start = ModeStart::load(None, false, true).unwrap();
        let (_, kc, (ready, detail)) = discovered(&mut start, at(&t.0));
        assert!(start.enforce() && ready);
        assert_eq!(kc.cgroup_driver.as_deref(), Some("systemd"));
        assert_eq!(
            detail,
            format!(
                "kubelet pid 77, beneath {}: flags --cgroup-driver",
                pid.join("root").display()
            )
        );
    }

    #[test]
    fn the_kubernetes_version_is_the_configurations_then_the_kubelets() {
        let v = |c, k| kubernetes_version(c, k).to_string();
        assert_eq!(
            v(Some("1.35"), Some("v1.36.3")),
            "1.35",
            "the configuration wins"
        );
        assert_eq!(v(None, Some("v1.36.3")), "1.36");
        assert_eq!(v(None, Some("v1.33.1+k3s1")), "1.34", "clamped");
        assert_eq!(v(None, Some("v1.41.0")), "1.37", "clamped");
        assert_eq!(v(None, Some("unknown")), "1.37");
        assert_eq!(v(None, None), "1.37");
    }

    #[test]
    fn configz_reads_the_kubelets_running_configuration() {
        let kc = parse_configz(
            r#"{"kubeletconfig": {"cgroupDriver": "systemd", "evictionHard": {"memory.available": "200Mi"}, "enableServer": true}}"#,
        )
        .unwrap();
        assert_eq!(kc.cgroup_driver.as_deref(), Some("systemd"));
        assert_eq!(
            kc.eviction_hard
                .unwrap()
                .get("memory.available")
                .map(String::as_str),
            Some("200Mi")
        );
        assert!(parse_configz(r#"{"other": {}}"#).is_err());
    }

    #[tokio::test]
    async fn configz_goes_through_the_node_proxy() {
        let (client, api) = mock::Routes::new()
            .on(
                "GET",
                "/api/v1/nodes/node-a/proxy/configz",
                200,
                serde_json::json!({"kubeletconfig": {"cgroupDriver": "cgroupfs"}}),
            )
            .client();
        let kc = configz(&client, "node-a").await.unwrap();
        assert_eq!(kc.cgroup_driver.as_deref(), Some("cgroupfs"));
        assert_eq!(api.requests().len(), 1);
    }

    /// The sibling modules a module's code (comments, strings and tests left out) names through
    /// `super::` or `crate::cluster::`.
    fn uses(text: &str) -> Vec<String> {
        let code = crate::layering::code_without_tests(text);
        let mut out = crate::layering::first_segments(&code, "super");
        out.extend(crate::layering::first_segments(&code, "crate::cluster"));
        out.into_iter().collect()
    }

    /// Data flows one way, (client →) source → unit → action (and the marks read back at start) → queue →
    /// writes: no module uses one downstream of it (source once used action's `Gangs`, action source's objects).
    #[test]
    fn the_cluster_modules_depend_one_way() {
        let modules = [
            ("client", include_str!("client.rs")),
            ("source", include_str!("source.rs")),
            ("unit", include_str!("unit.rs")),
            ("action", include_str!("action.rs")),
            ("marks", include_str!("marks.rs")),
            ("queue", include_str!("queue.rs")),
            ("writes", include_str!("writes.rs")),
            ("report", include_str!("report.rs")),
            ("review", include_str!("review.rs")),
        ];
        let got: Vec<(&str, Vec<String>)> = modules.iter().map(|(m, t)| (*m, uses(t))).collect();
        let want =
            |m: &'static str, uses: &[&str]| (m, uses.iter().map(ToString::to_string).collect());
        assert_eq!(
            got,
            [
                want("client", &[]),
                want("source", &["client"]),
                want("unit", &["source"]),
                want("action", &["queue", "unit", "writes"]),
                want("marks", &["action", "queue", "writes"]),
                want("queue", &["writes"]),
                want("writes", &[]),
                want("report", &["queue", "source", "writes"]),
                want("review", &[]),
            ]
        );
    }
}
