//! The `idemgate` binary: parse the command line, set up logging, run.

mod config_file;

use std::io::{IsTerminal, Write};

use anyhow::Context;
use clap::Parser;
use idemgate::access_log::{self, AccessLog};
use idemgate::config::{Config, StoreUrl};
use idemgate::log_sink::{FlushGuard, LogSink};
use idemgate::server::{Gateway, StartError, StartOptions};
use idemgate::systemd::Notifier;
use idemgate::workers::Workers;
use idemgate_tools::cli::{AlertsCommand, Cli, Command, LogFormat};
use idemgate_tools::mock_upstream::MockUpstream;
use tokio::signal::unix::{SignalKind, signal as unix_signal};
use tracing_subscriber::EnvFilter;

use crate::config_file::StartedFrom;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_));
    let runtime = match runtime(serving) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idemgate: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idemgate: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(serve) => {
            // Taken over before anything else (a config file may be slow to
            // read): from then on a SIGHUP reloads the TLS certificates
            // instead of ending the process.
            let mut hangup = unix_signal(SignalKind::hangup())?;
            // Likewise SIGTERM and SIGINT: one while the gateway starts
            // stops it there, instead of the signal's default ending it.
            let mut shutdown = Shutdown::listen()?;
            let (access_log, _log) = init_logging(serve.log_format)?;
            // Read first: an edit between the two reads is then one a
            // reload reports, never one taken for what started.
            let started_from = StartedFrom::read(&serve);
            let config = serve.config()?;
            let store = config.store.url.to_string();
            let grace = config.server.shutdown_grace;
            let systemd = Notifier::from_env();
            systemd.starting(&format!("opening and migrating the store {store}"));
            // This thread's runtime is the first worker; the others get
            // threads of their own.
            let threads = worker_threads();
            let workers = Workers::start(threads - 1).context("cannot start the worker threads")?;
            let options = StartOptions {
                workers: match threads {
                    1 => Vec::new(),
                    _ => std::iter::once(tokio::runtime::Handle::current())
                        .chain(workers.handles().iter().cloned())
                        .collect(),
                },
                access_log,
                accept_route_changes: serve.accept_route_changes,
                ..StartOptions::default()
            };
            let gateway = tokio::select! {
                started = Gateway::start_with(config, options) => {
                    // Named the store only where the store is what failed.
                    started.map_err(|error| {
                        let about = match &error {
                            StartError::Store(_) | StartError::StoreKeys(_) => {
                                format!("cannot start (store {store})")
                            }
                            _ => "cannot start".to_string(),
                        };
                        anyhow::Error::new(error).context(about)
                    })?
                }
                () = shutdown.recv() => {
                    tracing::info!("stopped while starting");
                    return Ok(());
                }
            };
            // One line on stdout that scripts and tests can wait for.
            println!(
                "listening proxy={} admin={}",
                gateway.addr(),
                gateway.admin_addr()
            );
            std::io::stdout().flush()?;
            systemd.ready(&gateway).await;
            {
                let shutdown = shutdown.recv();
                let watch = systemd.keep_watch(&gateway);
                tokio::pin!(shutdown, watch);
                loop {
                    tokio::select! {
                        () = &mut shutdown => break,
                        _ = hangup.recv() => {
                            systemd.reloading();
                            // Logged per listener; the old certificate stays on error.
                            let outcome = gateway.reload_tls();
                            if let Some(file) = &started_from {
                                file.warn_if_changed(&gateway).await;
                            }
                            systemd.reloaded(&gateway, &outcome).await;
                        }
                        () = &mut watch => {}
                    }
                }
            }
            tracing::info!("shutting down");
            systemd.stopping(grace);
            gateway.shutdown().await;
            drop(workers);
            Ok(())
        }
        Command::CheckConfig { file } => {
            let config = Config::load(&file)?;
            // As `serve` reads them at start, named by their fields.
            let tls = idemgate::tls::read(&config).with_context(|| file.display().to_string())?;
            for warning in tls.warnings() {
                eprintln!("warning: {warning}");
            }
            for warning in config.warnings() {
                eprintln!("warning: {warning}");
            }
            println!("ok");
            Ok(())
        }
        Command::Keys(keys) => match idemgate_tools::keys_cli::run(&keys).await {
            Ok(output) => {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(output.as_bytes())?;
                stdout.flush()?;
                Ok(())
            }
            // `error: <status> <name>: <detail>`, without the `idemgate:`
            // prefix other commands get: operators' scripts match this line.
            Err(error) => {
                eprintln!("error: {error}");
                std::process::exit(1);
            }
        },
        Command::Healthcheck(check) => match idemgate_tools::healthcheck::run(&check).await {
            Ok(answer) => {
                println!("ready: {answer}");
                Ok(())
            }
            Err(why) => {
                eprintln!("not ready: {why}");
                std::process::exit(1);
            }
        },
        Command::MockUpstream { listen } => {
            let _log = init_logging(LogFormat::Text)?;
            let mock = MockUpstream::start(listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            println!("listening mock={}", mock.addr());
            std::io::stdout().flush()?;
            Shutdown::listen()?.recv().await;
            mock.stop().await;
            Ok(())
        }
        Command::Demo => {
            init_quiet_logging();
            idemgate_tools::demo::run(std::io::stdout()).await?;
            Ok(())
        }
        Command::Rehearse(rehearse) => {
            init_quiet_logging();
            let env = |name: &str| std::env::var(name).ok();
            let report = idemgate_tools::rehearse::run(&rehearse, &env, std::io::stdout()).await?;
            std::io::stdout().flush()?;
            // The own gateway is shut down by now; exit 1 is the verdict.
            if !report.ok {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Bench(bench) => {
            init_quiet_logging();
            let report = idemgate_tools::bench::run(&bench, std::io::stdout()).await?;
            std::io::stdout().flush()?;
            // The own gateway is shut down by now; exit 1 is the verdict,
            // or a run in which nothing answered.
            if report.exactly_once == Some(false) || !report.answered() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Alerts {
            command: AlertsCommand::Test { config },
        } => {
            let config = Config::load(&config)?;
            let (report, all_delivered) = idemgate::alerts::test_endpoints(&config).await?;
            print!("{report}");
            std::io::stdout().flush()?;
            if !all_delivered {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Conformance(args) => {
            init_quiet_logging();
            let passed = idemgate_tools::conformance::command(&args, std::io::stdout()).await?;
            std::io::stdout().flush()?;
            if !passed {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Rekey { config } => {
            let _log = init_logging(LogFormat::Text)?;
            let config = Config::load(&config)?;
            let store = config.store.url.to_string();
            let done = idemgate::rekey::run(&config, &|name| std::env::var(name).ok())
                .await
                .with_context(|| format!("cannot rekey the store {store}"))?;
            println!(
                "rekeyed {store}: {} operations, {} sealed again under the current key",
                done.operations, done.resealed
            );
            Ok(())
        }
        Command::Migrate { store } => {
            let _log = init_logging(LogFormat::Text)?;
            let url =
                StoreUrl::parse(&store).map_err(|reason| anyhow::anyhow!("--store: {reason}"))?;
            idemgate::stores::migrate(&url).await?;
            println!("migrated {url}");
            Ok(())
        }
    }
}

/// The async runtime. `serve`: a single-threaded one on this thread, the
/// first of [`worker_threads`] (`idemgate::workers`: each proxy connection
/// lives on one thread). Other commands (the in-process `bench` and
/// `demo`, `healthcheck`, …): tokio's work-stealing one, one worker thread
/// per CPU but one, at least one, as the store's writer thread runs beside
/// the workers; `TOKIO_WORKER_THREADS` overrides ([`threads_set`]).
fn runtime(serving: bool) -> std::io::Result<tokio::runtime::Runtime> {
    if serving {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
    }
    // Always set here: left to tokio, a `TOKIO_WORKER_THREADS` that is not
    // a positive number panics (`healthcheck` in a container would exit
    // 101 while its gateway serves).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads_set().unwrap_or(cpus.saturating_sub(1).max(1)))
        .enable_all()
        .build()
}

/// The threads serving proxy connections: `TOKIO_WORKER_THREADS` if set
/// ([`threads_set`]), else one per CPU. Measured on 2 CPUs under wrk
/// (`benches/README.md`), two beat one on every load even though the
/// store's writer thread competes with them: forwarding 0.88× nginx
/// against 0.74×, first writes 0.32× against 0.28×, replays 1.68×
/// against 1.52×.
fn worker_threads() -> usize {
    threads_set().unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `TOKIO_WORKER_THREADS` as docs/configuration.md reads it: a number, at
/// least one (`0` is one); anything else leaves the default.
fn threads_set() -> Option<usize> {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .map(|n| n.max(1))
}

/// Logs to stderr through [`LogSink`]: a line is a copy into memory,
/// written out in batches by a thread of their own, so a slow reader of
/// stderr never stalls a request (past a bound, lines are dropped and
/// counted instead). Every line but the requests' is tracing-subscriber's
/// (text or JSON); the requests' are the [`AccessLog`]'s, in the same
/// format, when `RUST_LOG` lets INFO lines of [`access_log::TARGET`]
/// through. Keep the guard until exit: it writes what is waiting.
fn init_logging(format: LogFormat) -> anyhow::Result<(Option<AccessLog>, FlushGuard)> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (sink, guard) =
        LogSink::start(std::io::stderr()).context("cannot start the log writer thread")?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only for a person at a terminal, never into log files.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(sink.clone());
    let format = match format {
        LogFormat::Text => {
            builder.init();
            access_log::Format::Text
        }
        LogFormat::Json => {
            builder.json().init();
            access_log::Format::Json
        }
    };
    // Asked once: the filter is read once, at start.
    let access_log = tracing::enabled!(target: access_log::TARGET, tracing::Level::INFO)
        .then(|| AccessLog::new(sink, format));
    Ok((access_log, guard))
}

/// Errors only: the command's own lines are the output, and a log line
/// per request would also slow the in-process gateway down.
fn init_quiet_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// SIGINT or SIGTERM.
/// SIGTERM and SIGINT, listened for from when it is made.
struct Shutdown {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Shutdown {
    fn listen() -> anyhow::Result<Shutdown> {
        Ok(Shutdown {
            terminate: unix_signal(SignalKind::terminate())?,
            interrupt: unix_signal(SignalKind::interrupt())?,
        })
    }

    /// The next of either.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
