//! Command-line parsing, dispatch and error reporting.
//!
//! Exit codes (as `docs/cli.md` lists them): 0 success, also when the reader of stdout goes
//! away; 1 runtime error (server unreachable, I/O); 2 usage error; 3 `check` found violations;
//! 4 the database cannot be used (held by another process for a command that writes, another
//! cluster's, an older or newer schema, left unclean with no writer to recover it, damaged, not
//! a database); 5 unknown resource (on the server, or no scope for it in the database).

/// Prints a line on stdout; a closed pipe (`| head`) becomes a quiet stop, never a panic.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints on stdout without a newline (see [`outln!`]).
macro_rules! outp {
    ($($arg:tt)*) => {
        $crate::cli::out(format_args!($($arg)*))
    };
}

/// A line on stderr. Write errors are ignored: stderr is where errors would go.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod columns;
mod db;
mod demo;
mod live;
mod output;
mod progress;
mod record;
mod resource;
mod scopes;
mod sim;

use std::fmt;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use durable_informer::informer::InformerError;
use durable_informer::store::StoreError;

/// Durable Kubernetes informers: a cache in an embedded crash-safe database.
#[derive(Parser, Debug)]
#[command(name = "durable-informer", version, about, long_about = None)]
pub struct Cli {
    /// Diagnostics on stderr: a level (error, warn, info, debug, trace) or a tracing filter
    /// (`durable_informer=debug,kube_client=info`). Default: errors only, no client noise.
    #[arg(long, global = true)]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// Demo cluster sizes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Size {
    /// About 1,000 Pods over 5 namespaces: seconds.
    Small,
    /// About 20,000 Pods over 50 namespaces.
    Medium,
    /// About 100,000 Pods over 100 namespaces.
    Large,
}

/// Where a live command finds its cluster.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
    /// API server URL, overriding the kubeconfig's; the kubeconfig's credentials and namespace
    /// are kept (as kubectl's --server). With no kubeconfig at all: no credentials.
    #[arg(long)]
    pub server: Option<String>,
}

/// What a live command watches.
#[derive(clap::Args, Debug, Clone)]
pub struct ScopeArgs {
    /// Resource as kubectl names it: `pods`, `pod`, `po`, `Pod`, `deployments.apps`,
    /// `pods.v1.`.
    #[arg(value_name = "RESOURCE", required_unless_present = "resource_flag")]
    pub resource: Option<String>,
    /// The resource as a flag (the older form; without -n/-A it keeps watching all namespaces).
    #[arg(long = "resource", short = 'r', value_name = "RESOURCE", conflicts_with = "resource")]
    pub resource_flag: Option<String>,
    /// Namespace (default: the kubeconfig context's, as kubectl).
    #[arg(long, short = 'n', conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// All namespaces.
    #[arg(long, short = 'A')]
    pub all_namespaces: bool,
    /// Label selector.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// Field selector.
    #[arg(long)]
    pub field_selector: Option<String>,
}

impl ScopeArgs {
    /// The resource, however it was given.
    pub fn resource(&self) -> &str {
        self.resource
            .as_deref()
            .or(self.resource_flag.as_deref())
            .unwrap_or_default()
    }

    /// The namespace to watch: `-n`, none for `-A`, else the context's — except in the older
    /// `-r` form, which watched all namespaces by default and keeps doing so (a database filled
    /// that way resumes instead of starting a new scope).
    pub fn effective_namespace(&self, context_namespace: &str) -> Option<String> {
        if let Some(ns) = &self.namespace {
            return Some(ns.clone());
        }
        if self.all_namespaces || self.resource.is_none() {
            return None;
        }
        Some(context_namespace.to_owned())
    }
}

/// Which stored objects an offline command reads.
#[derive(clap::Args, Debug, Clone)]
pub struct QueryArgs {
    /// Namespace (default: all; the database has no kubeconfig context).
    #[arg(long, short = 'n', conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// All namespaces (the default offline; accepted as in kubectl).
    #[arg(long, short = 'A')]
    pub all_namespaces: bool,
    /// Label selector.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// Field selector: `metadata.name`, `metadata.namespace` or any dotted path of the object
    /// (`status.phase=Running,spec.nodeName!=n1`).
    #[arg(long)]
    pub field_selector: Option<String>,
}

/// How objects are printed.
#[derive(clap::Args, Debug, Clone)]
pub struct PrintArgs {
    /// Output format: table, wide, name, json, yaml, jsonpath=TEMPLATE,
    /// custom-columns=HEADER:PATH,…
    #[arg(long, short = 'o')]
    pub output: Option<String>,
    /// Print tables and custom columns without the header row.
    #[arg(long)]
    pub no_headers: bool,
    /// Add a LABELS column to tables.
    #[arg(long)]
    pub show_labels: bool,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the whole story on a built-in simulated cluster: sync, churn, restart without a
    /// LIST, a relist after compaction reporting only differences.
    Demo {
        /// Cluster size.
        #[arg(long, value_enum, default_value = "medium")]
        size: Size,
        /// Database file (default: a temporary one, removed at the end unless --keep).
        #[arg(long)]
        db: Option<PathBuf>,
        /// Keep the temporary database and print where, for a look with `get`, `history` or
        /// `stats` afterwards (a --db file is always kept).
        #[arg(long)]
        keep: bool,
        /// Output format of the summary: table or json.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// Run a persistent informer and print its events; resumes on restart.
    Watch {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Output format: table, name, json (one event a line) or yaml (one document an event).
        #[arg(long, short = 'o')]
        output: Option<String>,
        /// Wipe the database if it belongs to another cluster instead of failing.
        #[arg(long)]
        reset_on_cluster_change: bool,
    },
    /// Record a resource's watch traffic into a recording (JSON Lines, `.zst` compressed).
    Record {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Recording file (`.jsonl` or `.jsonl.zst`).
        #[arg(long)]
        out: PathBuf,
        /// Start a new file after this many bytes.
        #[arg(long)]
        rotate_bytes: Option<u64>,
        /// Stop after this many seconds (default: until SIGINT/SIGTERM).
        #[arg(long)]
        duration: Option<u64>,
        /// Output format of the summary: table, json or yaml.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// Replay a recording (or `kubectl get --raw '…?watch=1'` output) into a database, offline.
    Replay {
        /// Recording files, in order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Database file (a fresh scope is filled).
        #[arg(long)]
        db: PathBuf,
        /// Resource (`configmaps`, `cm`, `deployments.apps`; default: from the objects'
        /// apiVersion/kind, which must match; the version comes from the objects, `v1` when
        /// they carry none).
        #[arg(long, short = 'r')]
        resource: Option<String>,
        /// `max` or a real-time factor (2 = twice as fast).
        #[arg(long, default_value = "max")]
        speed: String,
        /// Stop once this resourceVersion is reached.
        #[arg(long)]
        until_rv: Option<String>,
        /// Stop before the first event received after this time (unix milliseconds, the
        /// recording's `receivedAt`).
        #[arg(long)]
        until_time: Option<u64>,
        /// Skip malformed lines instead of failing.
        #[arg(long)]
        skip_malformed: bool,
        /// Output format of the report: table, json or yaml.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// Write a database's log back out as a recording.
    Export {
        /// Resource (default: every scope).
        #[arg(value_name = "RESOURCE")]
        resource: Option<String>,
        /// The resource as a flag (the older form).
        #[arg(long = "resource", short = 'r', value_name = "RESOURCE", conflicts_with = "resource")]
        resource_flag: Option<String>,
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Recording file (`.zst` to compress).
        #[arg(long)]
        out: PathBuf,
        /// Output format of the summary: table, json or yaml.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// Print stored objects: `get pods`, `get pods web-0 -n prod`, `get pod/web-0`.
    Get {
        /// `RESOURCE [NAME…]` or `RESOURCE/NAME…`; with -r, only the names (`NAME` or the older
        /// `NAMESPACE/NAME`). Without a name, a list.
        #[arg(value_name = "RESOURCE [NAME]")]
        args: Vec<String>,
        /// The resource as a flag (the older form; a named object then prints as JSON unless
        /// -o says otherwise).
        #[arg(long = "resource", short = 'r', value_name = "RESOURCE")]
        resource: Option<String>,
        #[command(flatten)]
        query: QueryArgs,
        #[command(flatten)]
        print: PrintArgs,
        /// Database file.
        #[arg(long)]
        db: PathBuf,
    },
    /// List stored objects (as `get RESOURCE` without names).
    List {
        /// Resource.
        #[arg(value_name = "RESOURCE", required_unless_present = "resource_flag")]
        resource: Option<String>,
        /// The resource as a flag (the older form).
        #[arg(long = "resource", short = 'r', value_name = "RESOURCE", conflicts_with = "resource")]
        resource_flag: Option<String>,
        #[command(flatten)]
        query: QueryArgs,
        /// Index lookup `NAME=VALUE` (for the label index: `labels=app=web`).
        #[arg(long)]
        index: Option<String>,
        #[command(flatten)]
        print: PrintArgs,
        /// Database file.
        #[arg(long)]
        db: PathBuf,
    },
    /// The retained history of one object: `history pods web-0 -n prod`.
    History {
        /// `RESOURCE NAME` or `RESOURCE/NAME`; with -r, only the name (`NAME` or the older
        /// `NAMESPACE/NAME`).
        #[arg(value_name = "RESOURCE NAME", required = true)]
        args: Vec<String>,
        /// The resource as a flag (the older form).
        #[arg(long = "resource", short = 'r', value_name = "RESOURCE")]
        resource: Option<String>,
        /// Namespace.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Output format: table, json (one event a line) or yaml (one document an event).
        #[arg(long, short = 'o')]
        output: Option<String>,
        /// Database file.
        #[arg(long)]
        db: PathBuf,
    },
    /// Scopes, objects, RVs, log and database size, last relist and why.
    Stats {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Output format: table, json or yaml.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// The scopes of a database: what each watches, its objects, size and last use.
    /// `scopes drop ID…` removes scopes nothing uses any more (a selector change leaves the
    /// old one behind).
    Scopes {
        #[command(subcommand)]
        command: Option<ScopesCommand>,
        /// Database file.
        #[arg(long, global = true)]
        db: Option<PathBuf>,
        /// Output format: table, json or yaml.
        #[arg(long, short = 'o', global = true)]
        output: Option<String>,
    },
    /// Verify the database's invariants; exit 0 only when they hold.
    Check {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Output format: table, json or yaml.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// Apply log retention, then compact the file.
    Compact {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Keep at most this many log entries (default: the store's retention).
        #[arg(long)]
        keep: Option<u64>,
        /// Output format of the summary: table, json or yaml.
        #[arg(long, short = 'o')]
        output: Option<String>,
    },
    /// The simulated API server.
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// Print a shell completion script: `source <(durable-informer completion bash)`.
    Completion {
        /// Shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `scopes` subcommands.
#[derive(Subcommand, Debug)]
pub enum ScopesCommand {
    /// Remove scopes: their objects, indexes and cursors (their log entries stay until
    /// retention removes them). Refused while another process writes the database.
    Drop {
        /// Scope ids, as `scopes` lists them.
        #[arg(required = true)]
        ids: Vec<u32>,
    },
}

/// `sim` subcommands.
#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Serve the simulated API server on 127.0.0.1 until SIGINT/SIGTERM.
    Serve {
        /// Port (default: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Write a kubeconfig for it here.
        #[arg(long)]
        kubeconfig_out: Option<PathBuf>,
        /// Generate a cluster of this size first (empty when not given).
        #[arg(long, value_enum)]
        size: Option<Size>,
    },
}

/// A failure with its exit code. The message is one line saying what happened and what to do.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
    /// Stdout was closed by its reader: stop without a message.
    pub quiet: bool,
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl CliError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            quiet: false,
        }
    }

    /// A failed write to stdout. A closed pipe is how `| head` says "enough": exit 0 quietly.
    pub fn stdout(e: &std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Self {
                code: 0,
                message: String::new(),
                quiet: true,
            }
        } else {
            Self::runtime(format!("cannot write to stdout: {e}"))
        }
    }

    pub fn runtime(message: impl fmt::Display) -> Self {
        Self::new(1, message.to_string())
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let code = match e {
            StoreError::Locked { .. }
            | StoreError::NewerSchema { .. }
            | StoreError::OlderSchema { .. }
            | StoreError::NeedsRecovery { .. }
            | StoreError::NotADatabase { .. }
            | StoreError::Corrupted { .. }
            | StoreError::ClusterMismatch { .. } => 4,
            _ => 1,
        };
        let mut message = e.to_string();
        if matches!(e, StoreError::ClusterMismatch { .. }) {
            message.push_str(RESET_HINT);
        }
        CliError::new(code, message)
    }
}

impl From<InformerError> for CliError {
    fn from(e: InformerError) -> Self {
        match e {
            InformerError::Store(s) => s.into(),
            InformerError::Reflector(durable_informer::reflector::ReflectorError::ClusterMismatch(m)) => {
                CliError::new(4, format!("{m}{RESET_HINT}"))
            }
            other => CliError::runtime(other),
        }
    }
}

/// Names the flag that "reset it" means on the command line.
pub const RESET_HINT: &str = " (watch --reset-on-cluster-change does that)";

pub type CliResult<T = ()> = Result<T, CliError>;

/// Writes to stdout (through [`outln!`] and [`outp!`]).
pub fn out(args: fmt::Arguments<'_>) -> CliResult {
    std::io::stdout()
        .lock()
        .write_fmt(args)
        .map_err(|e| CliError::stdout(&e))
}

/// The default filter: errors only, without kube's own report of a failure the command states
/// itself in one line.
const DEFAULT_LOG: &str = "error,kube_client=off,kube_runtime=off";

fn init_tracing(level: Option<&str>) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(level.unwrap_or(DEFAULT_LOG))
        .map_err(|e| format!("bad --log {:?}: {e}", level.unwrap_or_default()))?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
    Ok(())
}

/// Parses, runs, and returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    if let Err(e) = init_tracing(cli.log.as_deref()) {
        errln!("error: {e}");
        return 2;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(run(cli.command));
    // Background tasks (watches) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => 0,
        Err(e) if e.quiet => e.code,
        Err(e) => {
            errln!("error: {e}");
            e.code
        }
    }
}

async fn run(command: Command) -> CliResult {
    use output::{Format, REPORT};
    let report = |raw: Option<&str>, command: &str| Format::parse(raw, command, REPORT, Format::Table);
    match command {
        Command::Demo { size, db, keep, output } => {
            let output = Format::parse(output.as_deref(), "demo", &["table", "json"], Format::Table)?;
            demo::run(size, db, keep, &output).await
        }
        Command::Watch {
            scope,
            cluster,
            db,
            output,
            reset_on_cluster_change,
        } => {
            let output = Format::parse(
                output.as_deref(),
                "watch",
                &["table", "name", "json", "yaml"],
                Format::Table,
            )?;
            live::watch(scope, cluster, db, output, reset_on_cluster_change).await
        }
        Command::Record {
            scope,
            cluster,
            out,
            rotate_bytes,
            duration,
            output,
        } => {
            let output = report(output.as_deref(), "record")?;
            record::record(scope, cluster, out, rotate_bytes, duration, &output).await
        }
        Command::Replay {
            files,
            db,
            resource,
            speed,
            until_rv,
            until_time,
            skip_malformed,
            output,
        } => {
            let output = report(output.as_deref(), "replay")?;
            record::replay(
                files,
                db,
                resource,
                &speed,
                until_rv,
                until_time,
                skip_malformed,
                &output,
            )
            .await
        }
        Command::Export {
            resource,
            resource_flag,
            db,
            out,
            output,
        } => {
            let output = report(output.as_deref(), "export")?;
            record::export(&db, resource.or(resource_flag).as_deref(), &out, &output)
        }
        Command::Get {
            args,
            resource,
            query,
            print,
            db,
        } => db::get(&db, resource.as_deref(), &args, &query, None, &print, "get"),
        Command::List {
            resource,
            resource_flag,
            query,
            index,
            print,
            db,
        } => {
            let args: Vec<String> = resource.into_iter().collect();
            db::get(
                &db,
                resource_flag.as_deref(),
                &args,
                &query,
                index.as_deref(),
                &print,
                "list",
            )
        }
        Command::History {
            args,
            resource,
            namespace,
            output,
            db,
        } => {
            let output = report(output.as_deref(), "history")?;
            db::history(&db, resource.as_deref(), &args, namespace.as_deref(), &output)
        }
        Command::Stats { db, output } => db::stats(&db, &report(output.as_deref(), "stats")?),
        Command::Scopes { command, db, output } => {
            let db = db.ok_or_else(|| CliError::new(2, "scopes needs --db FILE"))?;
            match command {
                None => scopes::list(&db, &report(output.as_deref(), "scopes")?),
                Some(ScopesCommand::Drop { ids }) => {
                    scopes::drop(&db, &ids, &report(output.as_deref(), "scopes drop")?)
                }
            }
        }
        Command::Check { db, output } => db::check(&db, &report(output.as_deref(), "check")?),
        Command::Compact { db, keep, output } => db::compact(&db, keep, &report(output.as_deref(), "compact")?),
        Command::Sim { command } => match command {
            SimCommand::Serve {
                port,
                kubeconfig_out,
                size,
            } => sim::serve(port, kubeconfig_out, size).await,
        },
        Command::Completion { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "durable-informer", &mut script);
            outp!("{}", String::from_utf8_lossy(&script))
        }
    }
}
