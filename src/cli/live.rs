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

use super::db::split_resource;
use super::{CliError, CliResult, ClusterArgs, Output, ScopeArgs};

/// A client for the cluster, and the server URL (part of the cluster identity).
pub async fn client(args: &ClusterArgs) -> CliResult<(kube::Client, String)> {
    let config = if let Some(server) = &args.server {
        let uri: http::Uri = server
            .parse()
            .map_err(|e| CliError::new(2, format!("bad --server {server:?}: {e}")))?;
        kube::Config::new(uri)
    } else {
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
                    .map_err(|e| CliError::runtime(format!("kubeconfig {}: {e}", path.display())))?
            }
            None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| CliError::runtime(format!("kubeconfig: {e}")))?,
            None => kube::Config::infer().await.map_err(|_| {
                CliError::runtime(
                    "no cluster configured: pass --kubeconfig FILE, set KUBECONFIG, or --server URL (try `durable-informer sim serve`)",
                )
            })?,
        }
    };
    let server = config.cluster_url.to_string();
    let client =
        kube::Client::try_from(config).map_err(|e| CliError::runtime(format!("cannot build a client: {e}")))?;
    Ok((client, server))
}

/// Resolves `plural[.group]` through discovery: the resource and whether it is namespaced.
pub async fn resolve(client: &kube::Client, server: &str, resource: &str) -> CliResult<(ApiResource, bool)> {
    let (plural, group) = split_resource(resource);
    let discovery = kube::discovery::Discovery::new(client.clone())
        .filter(&[group.as_str()])
        .run()
        .await
        .map_err(|e| {
            CliError::runtime(format!(
                "cannot reach the API server at {server}: {e}; check --server or --kubeconfig"
            ))
        })?;
    for g in discovery.groups() {
        for (ar, caps) in g.recommended_resources() {
            if ar.plural == plural && ar.group == group {
                return Ok((ar, caps.scope == kube::discovery::Scope::Namespaced));
            }
        }
    }
    Err(CliError::new(
        5,
        format!("unknown resource {resource:?} on {server} (use plural[.group], e.g. pods or deployments.apps)"),
    ))
}

fn print_event(output: Output, ev: &Event<DynamicObject>) -> CliResult {
    let (kind, obj) = match ev {
        Event::Add { object, .. } => ("ADDED", object),
        Event::Update { new, .. } => ("MODIFIED", new),
        Event::Delete { object, .. } => ("DELETED", object),
    };
    match output {
        Output::Json | Output::Yaml => outln!("{}", json!({"type": kind, "object": &**obj}))?,
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
) -> KubeSource {
    let mut source = KubeSource::new(client, server, ar);
    match (&scope.namespace, namespaced) {
        (Some(ns), true) => source = source.namespace(ns),
        (Some(ns), false) => errln!(
            "warning: {} is cluster-scoped; -n {ns} does not apply and every object is watched",
            scope.resource
        ),
        (None, _) => {}
    }
    if let Some(l) = &scope.selector {
        source = source.labels(l);
    }
    if let Some(f) = &scope.field_selector {
        source = source.fields(f);
    }
    source
}

pub async fn watch(scope: ScopeArgs, cluster: ClusterArgs, db: PathBuf, output: Output, reset: bool) -> CliResult {
    let stop_signal = signals();
    let (client, server) = client(&cluster).await?;
    let (ar, namespaced) = resolve(&client, &server, &scope.resource).await?;
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
        tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(db)))
            .await
            .map_err(CliError::runtime)??
    };
    let source = scoped_source(client, &server, ar, namespaced, &scope);
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
    if output == Output::Table {
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
                    if let Err(e) = print_event(output, &ev) {
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
