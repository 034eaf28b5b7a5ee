//! Commands that talk to a cluster: `watch`, and the helpers to build a client and resolve a
//! resource.

use std::path::PathBuf;
use std::sync::Arc;

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::reflector::ReflectorConfig;
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use kube::api::{ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use super::output::{yaml, Format};
use super::resource::{builtin_lookup, name_prefix, Wanted};
use super::{CliError, CliResult, ClusterArgs, ScopeArgs};

/// The kubeconfig (or in-cluster) configuration `args` name.
async fn load_config(args: &ClusterArgs) -> CliResult<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| CliError::runtime(format!("cannot read kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| CliError::runtime(format!("kubeconfig {}: {e}", path.display())))
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| CliError::runtime(format!("kubeconfig: {e}"))),
        None => kube::Config::infer().await.map_err(|_| {
            CliError::runtime(
                "no cluster configured: pass --kubeconfig FILE, set KUBECONFIG, or --server URL (try `durable-informer sim serve`)",
            )
        }),
    }
}

/// A client for the cluster, the server URL (part of the cluster identity) and the context's
/// namespace (`default` when it names none).
pub async fn client(args: &ClusterArgs) -> CliResult<(kube::Client, String, String)> {
    let config = if let Some(server) = &args.server {
        let uri: http::Uri = server
            .parse()
            .map_err(|e| CliError::new(2, format!("bad --server {server:?}: {e}")))?;
        // As kubectl: --server replaces only the URL; credentials, TLS settings and namespace
        // stay the kubeconfig's. Without any kubeconfig (the simulated server) there are none.
        let explicit = args.kubeconfig.is_some() || args.context.is_some();
        match load_config(args).await {
            Ok(mut config) => {
                config.cluster_url = uri;
                config
            }
            Err(e) if explicit => return Err(e),
            Err(_) => kube::Config::new(uri),
        }
    } else {
        load_config(args).await?
    };
    let server = config.cluster_url.to_string();
    let namespace = config.default_namespace.clone();
    let client =
        kube::Client::try_from(config).map_err(|e| CliError::runtime(format!("cannot build a client: {e}")))?;
    Ok((client, server, namespace))
}

/// Resolves a resource as kubectl names it (`pods`, `po`, `Pod`, `deployments.apps`,
/// `pods.v1.`) through discovery: the resource and whether it is namespaced.
pub async fn resolve(client: &kube::Client, server: &str, resource: &str) -> CliResult<(ApiResource, bool)> {
    let wanted = Wanted::parse(resource);
    // A standard resource's group is known here, so discovery asks for that group only;
    // otherwise every group is looked at (a kind or singular of a custom resource).
    let group = builtin_lookup(&wanted)
        .map(|(_, g)| g.to_owned())
        .or_else(|| wanted.group.clone());
    let mut discovery = kube::discovery::Discovery::new(client.clone());
    if let Some(g) = &group {
        discovery = discovery.filter(&[g.as_str()]);
    }
    let discovery = discovery.run().await.map_err(|e| {
        CliError::runtime(format!(
            "cannot reach the API server at {server}: {e}; check --server or --kubeconfig"
        ))
    })?;
    let mut found: Vec<(ApiResource, bool)> = Vec::new();
    for g in discovery.groups() {
        let resources = match &wanted.version {
            Some(v) => g.versioned_resources(v),
            None => g.recommended_resources(),
        };
        for (ar, caps) in resources {
            if wanted.matches(&ar.plural, &ar.group, &ar.version, Some(&ar.kind)) {
                found.push((ar, caps.scope == kube::discovery::Scope::Namespaced));
            }
        }
    }
    // `events` is core and events.k8s.io: the core one first, as kubectl.
    found.sort_by_key(|(ar, _)| !ar.group.is_empty());
    found.into_iter().next().ok_or_else(|| {
        CliError::new(
            5,
            format!("unknown resource {resource:?} on {server} (e.g. pods, po, Pod, deployments.apps)"),
        )
    })
}

fn print_event(output: &Format, prefix: &str, ev: &Event<DynamicObject>) -> CliResult {
    let (kind, obj) = match ev {
        Event::Add { object, .. } => ("ADDED", object),
        Event::Update { new, .. } => ("MODIFIED", new),
        Event::Delete { object, .. } => ("DELETED", object),
    };
    match output {
        Format::Json => outln!("{}", json!({"type": kind, "object": &**obj}))?,
        Format::Yaml => outp!("---\n{}", yaml(&json!({"type": kind, "object": &**obj}))?)?,
        Format::Name => outln!("{prefix}/{}", obj.metadata.name.as_deref().unwrap_or("-"))?,
        _ => outln!(
            "{:<9} {:<24} {:<48} {}",
            kind,
            obj.metadata.namespace.as_deref().unwrap_or("-"),
            obj.metadata.name.as_deref().unwrap_or("-"),
            obj.metadata.resource_version.as_deref().unwrap_or("-")
        )?,
    }
    Ok(())
}

/// Registers SIGINT and SIGTERM handlers now (so a signal arriving before the returned future is
/// polled is not lost to the default action) and returns a future that completes on either.
pub fn signals() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = wait(term) => {}
            () = wait(int) => {}
        }
    }
}

/// A source for `ar` restricted by the command line's namespace and selectors.
pub fn scoped_source(
    client: kube::Client,
    server: &str,
    ar: ApiResource,
    namespaced: bool,
    scope: &ScopeArgs,
    context_namespace: &str,
) -> KubeSource {
    let mut source = KubeSource::new(client, server, ar);
    match (scope.effective_namespace(context_namespace), namespaced) {
        (Some(ns), true) => source = source.namespace(&ns),
        // The context's namespace means nothing to a cluster-scoped resource; an explicit -n
        // is said.
        (Some(ns), false) if scope.namespace.is_some() => errln!(
            "warning: {} is cluster-scoped; -n {ns} does not apply and every object is watched",
            scope.resource()
        ),
        _ => {}
    }
    if let Some(l) = &scope.selector {
        source = source.labels(l);
    }
    if let Some(f) = &scope.field_selector {
        source = source.fields(f);
    }
    source
}

pub async fn watch(scope: ScopeArgs, cluster: ClusterArgs, db: PathBuf, output: Format, reset: bool) -> CliResult {
    let stop_signal = signals();
    let (client, server, context_ns) = client(&cluster).await?;
    let (ar, namespaced) = resolve(&client, &server, scope.resource()).await?;
    let prefix = name_prefix(&ar.kind, &ar.group);
    let secrets = ar.plural == "secrets" && ar.group.is_empty();
    if secrets {
        if std::env::var("DURABLE_INFORMER_ALLOW_SECRETS").as_deref() != Ok("1") {
            return Err(CliError::new(
                2,
                "watching Secrets stores them on disk in the database file; set DURABLE_INFORMER_ALLOW_SECRETS=1 to allow it",
            ));
        }
        errln!(
            "warning: Secrets are stored on disk in {} (DURABLE_INFORMER_ALLOW_SECRETS=1); keep the file private",
            db.display()
        );
    }
    let store = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(db).live_inspection(true)))
            .await
            .map_err(CliError::runtime)??
    };
    let source = scoped_source(client, &server, ar, namespaced, &scope, &context_ns);
    let config = ReflectorConfig {
        reset_on_cluster_change: reset,
        ..ReflectorConfig::default()
    };
    let mut builder = Informer::<DynamicObject>::builder(&store, source).reflector_config(config);
    if secrets {
        builder = builder.allow_secrets();
    }
    let informer = builder.build().await?;
    if informer.is_restored() {
        errln!(
            "resuming from resourceVersion {} stored in {} (no full LIST)",
            informer.last_synced_resource_version().map(|r| r.0).unwrap_or_default(),
            db.display()
        );
    }
    if output == Format::Table {
        outln!("{:<9} {:<24} {:<48} RESOURCE-VERSION", "EVENT", "NAMESPACE", "NAME")?;
    }
    // Durable: after a restart it prints only what happened since. When stdout fails (the
    // reader went away) the watch stops instead of running on unseen.
    let stdout_failed = Arc::new(tokio::sync::Notify::new());
    let failed = Arc::new(std::sync::Mutex::new(None::<CliError>));
    let handler = {
        let (stdout_failed, failed) = (stdout_failed.clone(), failed.clone());
        handler_fn(
            move |ev: Event<DynamicObject>| -> Result<(), std::convert::Infallible> {
                let mut first = failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if first.is_none() {
                    if let Err(e) = print_event(&output, &prefix, &ev) {
                        *first = Some(e);
                        stdout_failed.notify_one();
                    }
                }
                Ok(())
            },
        )
    };
    let _reg = informer.add_shared_handler(Arc::new(handler), HandlerOptions::durable("cli-watch"));
    informer.start();
    let mut status = informer.status();
    let outcome = tokio::select! {
        () = stop_signal => Ok(()),
        () = stdout_failed.notified() => {
            let e = failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            e.map_or(Ok(()), Err)
        }
        r = status.wait_for(|s| s.phase == durable_informer::reflector::Phase::Stopped) => {
            let _ = r;
            match informer.errors().into_iter().rev().find(|e| e.contains("belongs to cluster")) {
                Some(msg) => Err(CliError::new(4, format!("{msg}{}", super::RESET_HINT))),
                None => Err(CliError::runtime("the watch stopped")),
            }
        }
    };
    informer.shutdown().await.ok();
    drop(informer);
    tokio::task::spawn_blocking(move || store.close())
        .await
        .map_err(CliError::runtime)??;
    outcome
}
