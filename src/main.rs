use airlock::commands::{self, FsCommand, ServeArgs};
use airlock::confine::SandboxArgs;
use airlock::llm_cli::{self, LlmArgs};
use airlock::simulate::{self, SimArgs};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

// Allocation runs through the proxy's and the simulator's hot paths, some
// thirty allocations a simulated step; mimalloc's are a fraction of glibc's
// cost (docs/perf.md). The library crates choose none.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// airlock stands between LLM-driven child processes and the host.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD as a child with the FS proxy on descriptor 3.
    Run {
        #[command(flatten)]
        serve: ServeArgs,
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[command(flatten)]
        env: airlock::envpolicy::EnvArgs,
        #[command(flatten)]
        egress: airlock::egress::EgressArgs,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        argv: Vec<OsString>,
    },
    /// Serve one client on an already-open socket descriptor (upstream role).
    Serve {
        /// The descriptor to serve.
        #[arg(long, value_name = "N")]
        fd: RawFd,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Reach files through the proxy from inside a child.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Ask the session's LLM broker, from inside a child; prints the answer.
    Llm(LlmArgs),
    /// The LLM budget left, from inside a child.
    Quota {
        /// Print the whole QUOTA result.
        #[arg(long)]
        json: bool,
    },
    /// Cancel an `airlock llm --cancel-token TOKEN` call of this child's tree.
    Cancel {
        #[arg(value_name = "TOKEN")]
        token: String,
    },
    /// Start CMD on a connection narrowed to --ro/--rw paths, with that
    /// narrowing's own secret in its environment, never the session's.
    Narrow(airlock::narrowcli::NarrowArgs),
    /// Large content as fd:N: wrap, read by page, export, search.
    #[command(subcommand)]
    Fd(airlock::fdcli::FdCommand),
    /// Run the deterministic simulator over many seeds.
    Sim(SimArgs),
    /// Host a VFS tool: CMD speaks NDJSON JSON-RPC on its stdin/stdout.
    Tool(airlock::tool::ToolArgs),
    /// Replay traces against the core; fail on the first output that differs.
    Replay {
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
    },
    /// Allow-listed host tools over HTTP (AIFO shim protocol).
    #[command(subcommand)]
    Toolexec(airlock::toolexec::ToolexecCommand),
}

fn main() -> ExitCode {
    // The confinement stage first: a fresh process that must stay
    // single-threaded and quick, before anything else starts.
    {
        let mut args = std::env::args_os();
        if args.nth(1).is_some_and(|a| a == airlock::confine::stage::STAGE_ARG) {
            let code = airlock::confine::stage::main(args.collect());
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Through a link named after a tool, the binary is that tool's shim.
    if let Some(tool) = std::env::args_os().next().and_then(|a| airlock::toolexec::shim::invoked_as_tool(&a))
    {
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        return ExitCode::from(u8::try_from(airlock::toolexec::shim::run(&tool, &args)).unwrap_or(1));
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run { serve, sandbox, env, egress, argv } => {
            commands::run(serve, sandbox, env, egress, argv)
        }
        Command::Serve { fd, serve } => commands::serve(serve, *fd),
        Command::Fs(cmd) => commands::fs(cmd),
        Command::Llm(args) => Ok(llm_cli::llm(args)),
        Command::Quota { json } => Ok(llm_cli::quota(*json)),
        Command::Cancel { token } => Ok(llm_cli::cancel(token)),
        Command::Narrow(args) => airlock::narrowcli::narrow(args),
        Command::Fd(cmd) => airlock::fdcli::fd(cmd),
        Command::Sim(args) => simulate::sim(args),
        Command::Replay { traces } => simulate::replay(traces),
        Command::Toolexec(cmd) => airlock::toolexec::toolexec(cmd),
        Command::Tool(args) => airlock::tool::tool(args),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("airlock: {e:#}");
            ExitCode::from(125)
        }
    }
}
