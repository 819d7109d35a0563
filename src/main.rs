//! The `turnlog` binary: parse the command line and run the subcommand (see [`turnlog::cli`]).

use clap::Parser;
use turnlog::cli::args::{Cli, Command};
use turnlog::cli::{self, acp, audit, follow, serve};

/// jemalloc rather than glibc's malloc: the writer and the HTTP thread allocate and free
/// many short-lived buffers (sled's node copies, request bodies, rendered events), and
/// glibc kept handing that memory back to the kernel and faulting it in again.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: unused pages go back to the kernel after about a
/// second rather than ten, so that the server's RSS follows what it holds (a burst's
/// buffers, once freed, do not stay counted against it).
/// The symbol is the C `const char *malloc_conf` (prefixed as this build of jemalloc is):
/// one thin pointer to a NUL-terminated string.
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Option<&u8> = Some(&b"dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0]);

fn main() -> anyhow::Result<()> {
    let Cli { command, serve } = Cli::parse();
    let status = match command.unwrap_or(Command::Serve) {
        Command::Serve => return serve::run(&serve),
        Command::HashKey { key } => {
            cli::hash_key(&key);
            return Ok(());
        }
        Command::Acp(args) => acp::run(&serve, args),
        Command::Export(args) => audit::export_command(&serve, args),
        Command::Import(args) => audit::import_command(&serve, args),
        Command::Verify(args) => audit::verify_command(&serve, args),
        Command::Tail(args) => follow::tail_command(args),
        Command::Replay(args) => follow::replay_command(&serve, args),
    };
    // Not waiting for what still runs (`acp`'s thread blocked reading stdin): its work is done.
    std::process::exit(status)
}
