//! `airlock toolexec shim TOOL [ARGS...]`: the Rust ToolExec v2 client.
//!
//! It asks for v2 (`X-Aifo-Proto: 2`, `TE: trailers`), writes each body chunk
//! to stdout the moment it arrives, and exits with the `X-Exit-Code` of the
//! trailer (or of the header, when the server answered as v1). Anything that
//! keeps it from learning the tool's exit code is a protocol or transport
//! error: a message on stderr and exit 86, the code the server uses for its
//! own refusals, so a caller can tell "the tool said 1" from "no answer".
//!
//! Invoked through a link whose name is not `airlock…`, the binary acts as
//! `airlock toolexec shim LINKNAME ARGS...` (see [`invoked_as_tool`]).

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, TE};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncWrite};

/// Exit code for every failure of the exchange itself.
pub const EXIT_PROTOCOL: i32 = 86;
/// Exit code when our stdout is gone: what a tool killed by SIGPIPE reports.
pub const EXIT_STDOUT_CLOSED: i32 = 128 + 13;
pub const URL_VAR: &str = "AIFO_TOOLEEXEC_URL";
pub const TOKEN_VAR: &str = "AIFO_TOOLEEXEC_TOKEN";
pub const EXIT_CODE_HEADER: &str = "x-exit-code";
pub const PROTO_HEADER: &str = "x-aifo-proto";

#[derive(Debug, Args)]
pub struct ShimArgs {
    /// The tool to run on the host, as the server's `--tool` names it.
    #[arg(value_name = "TOOL")]
    pub tool: OsString,
    /// Its arguments, passed as argv (no shell).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Why the shim could not report the tool's exit code.
#[derive(Debug)]
pub enum ShimError {
    NotConfigured(&'static str),
    BadUrl { url: String, why: &'static str },
    BadToken,
    Cwd(io::Error),
    Connect { target: String, err: io::Error },
    Http(hyper::Error),
    NoExitCode(StatusCode),
    BadExitCode(String),
    StdoutClosed,
    Stdout(io::Error),
    Runtime(io::Error),
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShimError::NotConfigured(var) => write!(f, "{var} is not set"),
            ShimError::BadUrl { url, why } => write!(f, "bad {URL_VAR} {url:?}: {why}"),
            ShimError::BadToken => write!(f, "{TOKEN_VAR} cannot travel in an HTTP header"),
            ShimError::Cwd(e) => write!(f, "cannot read the working directory: {e}"),
            ShimError::Connect { target, err } => write!(f, "cannot connect to {target}: {err}"),
            ShimError::Http(e) => write!(f, "HTTP exchange failed: {e}"),
            ShimError::NoExitCode(s) => write!(f, "the {s} response carried no X-Exit-Code"),
            ShimError::BadExitCode(v) => write!(f, "X-Exit-Code {v:?} is not a number in 0..=255"),
            ShimError::StdoutClosed => write!(f, "stdout is closed"),
            ShimError::Stdout(e) => write!(f, "writing stdout: {e}"),
            ShimError::Runtime(e) => write!(f, "starting the runtime: {e}"),
        }
    }
}

impl std::error::Error for ShimError {}

/// Where the request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp { host: String, port: u16, authority: String, path: String },
    Unix(PathBuf),
}

impl Target {
    /// `unix://PATH` as the seed's shim reads it (everything after the
    /// scheme is the socket path, so `unix:///run/x.sock` is `/run/x.sock`),
    /// or `http://HOST[:PORT][/PATH]`, sent to PATH as curl would.
    pub fn parse(url: &str) -> Result<Target, ShimError> {
        let bad = |why| ShimError::BadUrl { url: url.to_string(), why };
        if let Some(path) = url.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(bad("no socket path after unix://"));
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// and unix:// are supported"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        Ok(Target::Tcp {
            host,
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_string(),
            path,
        })
    }

    fn host_header(&self) -> &str {
        match self {
            Target::Tcp { authority, .. } => authority,
            Target::Unix(_) => "localhost",
        }
    }

    fn path(&self) -> &str {
        match self {
            Target::Tcp { path, .. } => path,
            Target::Unix(_) => "/exec",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp { host, port, .. } => write!(f, "{host}:{port}"),
            Target::Unix(p) => write!(f, "unix socket {}", p.display()),
        }
    }
}

/// The form body: `tool`, `cwd`, then one `arg` per argument in order, each
/// byte percent-encoded so non-UTF-8 arguments arrive byte for byte.
pub fn form_body(tool: &OsStr, cwd: &Path, args: &[OsString]) -> String {
    let mut body = String::new();
    let mut field = |key: &str, value: &[u8]| {
        if !body.is_empty() {
            body.push('&');
        }
        body.push_str(key);
        body.push('=');
        body.extend(form_urlencoded::byte_serialize(value));
    };
    field("tool", tool.as_bytes());
    field("cwd", cwd.as_os_str().as_bytes());
    for a in args {
        field("arg", a.as_bytes());
    }
    body
}

/// The exit code a response names, from the trailer first.
pub fn exit_code(
    header: Option<&HeaderValue>,
    trailer: Option<&HeaderValue>,
) -> Result<Option<i32>, ShimError> {
    let Some(v) = trailer.or(header) else { return Ok(None) };
    let text = String::from_utf8_lossy(v.as_bytes()).trim().to_string();
    match text.parse::<u8>() {
        Ok(n) => Ok(Some(i32::from(n))),
        Err(_) => Err(ShimError::BadExitCode(text)),
    }
}

/// The link name when the binary was started through a link named after a
/// tool; `None` for `airlock` itself (or any name starting with `airlock`,
/// such as a versioned copy).
pub fn invoked_as_tool(argv0: &OsStr) -> Option<OsString> {
    let name = Path::new(argv0).file_name()?;
    if name.as_bytes().starts_with(b"airlock") {
        None
    } else {
        Some(name.to_os_string())
    }
}

/// Run the tool through the server named by the environment; the process
/// exit code.
pub fn run(tool: &OsStr, args: &[OsString]) -> i32 {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ShimError::Runtime)
        .and_then(|rt| rt.block_on(exec(tool, args)));
    match result {
        Ok(code) => code,
        Err(ShimError::StdoutClosed) => EXIT_STDOUT_CLOSED,
        Err(e) => {
            eprintln!("airlock toolexec shim: {e}");
            EXIT_PROTOCOL
        }
    }
}

fn env_var(name: &'static str) -> Result<String, ShimError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v),
        _ => Err(ShimError::NotConfigured(name)),
    }
}

async fn exec(tool: &OsStr, args: &[OsString]) -> Result<i32, ShimError> {
    let url = env_var(URL_VAR)?;
    let token = env_var(TOKEN_VAR)?;
    let target = Target::parse(&url)?;
    let cwd = std::env::current_dir().map_err(ShimError::Cwd)?;
    let body = form_body(tool, &cwd, args);
    let auth = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| ShimError::BadToken)?;
    let host = HeaderValue::from_str(target.host_header())
        .map_err(|_| ShimError::BadUrl { url: url.clone(), why: "bad host" })?;
    let req = Request::post(target.path())
        .header(HOST, host)
        .header(AUTHORIZATION, auth)
        .header(PROTO_HEADER, "2")
        .header(TE, "trailers")
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| ShimError::BadUrl { url: url.clone(), why: "cannot form a request" })?;
    match &target {
        Target::Tcp { host, port, .. } => {
            let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|err| ShimError::Connect { target: target.to_string(), err })?;
            exchange(s, req).await
        }
        Target::Unix(path) => {
            let s = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|err| ShimError::Connect { target: target.to_string(), err })?;
            exchange(s, req).await
        }
    }
}

async fn exchange<S>(io: S, req: Request<Full<Bytes>>) -> Result<i32, ShimError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(ShimError::Http)?;
    // The connection task ends with the exchange; dropping `sender` and the
    // body (early return included) closes the socket, which is how the
    // server learns we are gone and kills the tool.
    let conn = tokio::spawn(conn);
    let result = receive(&mut sender, req).await;
    drop(sender);
    conn.abort();
    result
}

async fn receive(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<i32, ShimError> {
    let resp = sender.send_request(req).await.map_err(ShimError::Http)?;
    let status = resp.status();
    let header = resp.headers().get(EXIT_CODE_HEADER).cloned();
    let mut body = resp.into_body();
    let mut trailers: Option<HeaderMap> = None;
    // Tool output goes to stdout; a refusal's text is not tool output.
    let to_stdout = status == StatusCode::OK;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ShimError::Http)?;
        match frame.into_data() {
            Ok(data) => {
                if to_stdout {
                    write_out(&mut io::stdout().lock(), &data)?;
                } else {
                    // A message we cannot show changes nothing about the code.
                    let _ = io::stderr().lock().write_all(&data);
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    let trailer = trailers.as_ref().and_then(|t| t.get(EXIT_CODE_HEADER));
    match exit_code(header.as_ref(), trailer)? {
        Some(code) => Ok(code),
        None => Err(ShimError::NoExitCode(status)),
    }
}

fn write_out(out: &mut impl Write, data: &[u8]) -> Result<(), ShimError> {
    // Flush per chunk: the point of v2 is that output shows as it happens.
    match out.write_all(data).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(ShimError::StdoutClosed),
        Err(e) => Err(ShimError::Stdout(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn urls() {
        assert_eq!(Target::parse("unix:///run/x.sock").unwrap(), Target::Unix("/run/x.sock".into()));
        assert_eq!(Target::parse("unix://rel.sock").unwrap(), Target::Unix("rel.sock".into()));
        assert_eq!(
            Target::parse("http://127.0.0.1:8080/exec").unwrap(),
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 8080,
                authority: "127.0.0.1:8080".into(),
                path: "/exec".into()
            }
        );
        assert_eq!(
            Target::parse("http://[::1]/exec").unwrap(),
            Target::Tcp { host: "::1".into(), port: 80, authority: "[::1]".into(), path: "/exec".into() }
        );
        for bad in ["", "unix://", "https://h/exec", "ftp://h", "not a url", "/exec"] {
            assert!(Target::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn form_is_byte_exact_and_ordered() {
        let args = vec![
            OsString::from("a b"),
            OsString::from("x=y&z"),
            OsString::from(""),
            OsString::from_vec(vec![0xff, b'%', b'+']),
        ];
        let body = form_body(OsStr::new("cargo"), Path::new("/w d"), &args);
        assert_eq!(body, "tool=cargo&cwd=%2Fw+d&arg=a+b&arg=x%3Dy%26z&arg=&arg=%FF%25%2B");
        let back: Vec<(Vec<u8>, Vec<u8>)> = form_urlencoded::parse(body.as_bytes())
            .map(|(k, v)| (k.into_owned().into_bytes(), v.into_owned().into_bytes()))
            .collect();
        // form_urlencoded's decoder is lossy on non-UTF-8; the first fields
        // prove order and escaping.
        assert_eq!(back[0], (b"tool".to_vec(), b"cargo".to_vec()));
        assert_eq!(back[2], (b"arg".to_vec(), b"a b".to_vec()));
        assert_eq!(back[3], (b"arg".to_vec(), b"x=y&z".to_vec()));
        assert_eq!(back[4], (b"arg".to_vec(), b"".to_vec()));
    }

    #[test]
    fn exit_codes() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(exit_code(Some(&v("3")), None).unwrap(), Some(3));
        assert_eq!(exit_code(Some(&v("3")), Some(&v("124"))).unwrap(), Some(124));
        assert_eq!(exit_code(None, None).unwrap(), None);
        for bad in ["-1", "256", "x", ""] {
            assert!(exit_code(None, Some(&v(bad))).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn link_names() {
        assert_eq!(invoked_as_tool(OsStr::new("/usr/bin/airlock")), None);
        assert_eq!(invoked_as_tool(OsStr::new("airlock-0.1")), None);
        assert_eq!(invoked_as_tool(OsStr::new("/shims/cargo")), Some(OsString::from("cargo")));
    }

    #[test]
    fn broken_stdout_is_its_own_case() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        assert!(matches!(write_out(&mut Broken, b"x"), Err(ShimError::StdoutClosed)));
    }
}
