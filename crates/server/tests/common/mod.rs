//! A raw HTTP/1.1 client over `TcpStream` (so tests can send invalid bytes and hang up
//! mid-stream) and helpers to start servers on fixture or default-model packages.

#![allow(dead_code)]

pub mod fixture;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oxgen::{KvBudget, Model, ModelOptions};
use oxgen_server::{Config, Server};
use serde_json::Value;

/// Starts a server on a free port over the package at `dir`, and waits until it is ready.
/// The model is opened as `oxgen serve` opens it (prefix cache on, KV for `max_batch` whole
/// contexts).
pub fn start(dir: &Path, threads: usize, config: Config) -> Server {
    let options = ModelOptions {
        threads,
        memory: oxgen::MemoryOptions {
            kv: KvBudget::Sequences(config.max_batch),
            prefix_cache: true,
            ..Default::default()
        },
        ..Default::default()
    };
    start_with(dir, options, config)
}

/// [`start`] with the model options given.
pub fn start_with(dir: &Path, options: ModelOptions, config: Config) -> Server {
    let dir = dir.to_path_buf();
    let server = Server::start(
        config,
        "127.0.0.1:0",
        Box::new(move || Model::open(&dir, &options).map_err(|e| e.to_string())),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while get(server.addr(), "/health").status != 200 {
        assert!(Instant::now() < deadline, "the server never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// The value of the `/metrics` line `series` (a name with its labels, if any).
#[allow(dead_code)]
pub fn metric(addr: SocketAddr, series: &str) -> f64 {
    let text = String::from_utf8(get(addr, "/metrics").body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}

/// The default model package (`$OXGEN_DEFAULT_MODEL`, set by scripts/test.sh).
pub fn default_model() -> PathBuf {
    oxgen_testkit::default_model_dir()
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent-events body.
    pub fn events(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(str::to_string)
            .collect()
    }
}

/// An open connection whose response is read piece by piece.
pub struct Conn {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    pending: String,
}

pub fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Conn {
    Conn::read_head(send(addr, method, path, headers, body))
}

/// Sends a request without waiting for any of the response.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    stream
}

impl Conn {
    /// Reads the status line and headers.
    pub fn read_head(stream: TcpStream) -> Conn {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
        Conn {
            reader,
            status,
            headers,
            chunked,
            pending: String::new(),
        }
    }

    /// The rest of the body.
    pub fn finish(mut self) -> Reply {
        let mut body = Vec::new();
        if self.chunked {
            while let Some(chunk) = self.chunk() {
                body.extend_from_slice(&chunk);
            }
        } else {
            self.reader.read_to_end(&mut body).unwrap();
        }
        let mut all = std::mem::take(&mut self.pending).into_bytes();
        all.extend_from_slice(&body);
        Reply {
            status: self.status,
            headers: self.headers,
            body: all,
        }
    }

    /// One chunk of a chunked body; `None` at its end.
    fn chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(line.trim(), 16).ok()?;
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).ok()?;
        data.truncate(size);
        (size > 0).then_some(data)
    }

    /// The next line of the body (a JSON line of Ollama's streams, or a line of an event).
    pub fn next_line(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.pending.find('\n') {
                let line: String = self.pending.drain(..end + 1).collect();
                if line.trim().is_empty() {
                    continue;
                }
                return Some(line.trim_end().to_string());
            }
            let chunk = self.chunk()?;
            self.pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next server-sent event's `data:` payload (keep-alive comments skipped).
    pub fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return Some(data.to_string());
                }
                continue;
            }
            let chunk = self.chunk()?;
            self.pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    open(addr, method, path, headers, body).finish()
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[], b"")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

/// `(queued, running, kv_sequences)` from `/health`.
pub fn live(addr: SocketAddr) -> (u64, u64, u64) {
    let h = get(addr, "/health").json();
    let r = &h["requests"];
    let n = |k: &str| r[k].as_u64().unwrap();
    (n("queued"), n("running"), n("kv_sequences"))
}

/// Waits until `/health` reports nothing queued, running or held.
pub fn wait_idle(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = live(addr);
        if now == (0, 0, 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "requests still live 30 s later: (queued, running, kv sequences) = {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
