//! A TCP proxy that injects store outages: between a client and Postgres or Redis it can pass
//! traffic, stall it (bytes held, connections open — a wedged store), or cut it (every
//! connection closed, new ones refused — a store that went away). Used by the tests and the
//! simulator so outages never require stopping a shared server.

use std::net::SocketAddr;

use shardkeep::backend::redis::{RedisOptions, RedisTimeouts};
use shardkeep::{Keyspace, RedisBackend};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything.
    Pass,
    /// Hold every byte; connections stay open.
    Stall,
    /// Close every connection and refuse new ones.
    Cut,
    /// Forward everything, each chunk held this long first (a slow store).
    Delay(std::time::Duration),
}

/// A running fault proxy. Dropping it stops it.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    stop: CancellationToken,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watcher) = watch::channel(ProxyMode::Pass);
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, upstream, watcher, stop.clone()));
        Ok(Self { addr, mode, stop })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode for every current and future connection.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

/// Anything whose traffic can be switched between the [`ProxyMode`]s.
pub trait ProxyControl {
    /// Switches the mode for every current and future connection.
    fn set_mode(&self, mode: ProxyMode);
}

impl ProxyControl for FaultProxy {
    fn set_mode(&self, mode: ProxyMode) {
        FaultProxy::set_mode(self, mode);
    }
}

/// One proxy per node of a deployment (every node of a Redis Cluster), switched together: an
/// outage of the whole tier.
#[derive(Debug, Default)]
pub struct ProxySet {
    proxies: Vec<FaultProxy>,
}

impl ProxySet {
    /// A set of `proxies`.
    pub fn new(proxies: Vec<FaultProxy>) -> Self {
        Self { proxies }
    }

    /// The proxies, in the order given.
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.proxies
    }
}

impl ProxyControl for ProxySet {
    fn set_mode(&self, mode: ProxyMode) {
        for proxy in &self.proxies {
            proxy.set_mode(mode);
        }
    }
}

/// A Redis backend on the deployment at `redis_url` whose traffic goes through one fault proxy in front of the server,
/// or on a cluster one in front of every node (the cluster's reported addresses mapped to them),
/// so an outage cuts the whole tier. Works on both topologies.
pub async fn proxied_redis(
    redis_url: &str,
    keys: Keyspace,
    timeouts: RedisTimeouts,
) -> Result<(ProxySet, RedisBackend), String> {
    let setup = |e: &dyn std::fmt::Display| e.to_string();
    let direct = RedisBackend::connect("REDIS_URL", redis_url, keys.clone(), timeouts)
        .await
        .map_err(|e| setup(&e))?;
    let first = shardkeep::backend::redis::redis_seeds(redis_url)
        .map_err(|e| setup(&e))?
        .first()
        .map(|s| (*s).to_owned())
        .unwrap_or_default();
    let upstreams: Vec<(String, u16)> = if direct.is_cluster() {
        direct
            .node_addresses()
            .await
            .map_err(|e| setup(&e))?
            .iter()
            .filter_map(|a| a.rsplit_once(':'))
            .filter_map(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
            .collect()
    } else {
        let info = redis::IntoConnectionInfo::into_connection_info(first.as_str())
            .map_err(|e| setup(&e))?;
        match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => vec![(host.clone(), *port)],
            other => {
                return Err(format!("a fault proxy needs a TCP Redis, got {other:?}"));
            }
        }
    };
    let mut proxies = Vec::new();
    let mut options = RedisOptions {
        timeouts,
        ..RedisOptions::default()
    };
    let mut urls = Vec::new();
    for (host, port) in upstreams {
        let proxy = FaultProxy::start(socket_addr(&host, port)?)
            .await
            .map_err(|e| setup(&e))?;
        let at = proxy.addr();
        options
            .node_map
            .insert((host, port), (at.ip().to_string(), at.port()));
        let mut url = url_with_addr(&first, at);
        if url.is_empty() {
            url = format!("redis://{at}");
        }
        urls.push(url);
        proxies.push(proxy);
    }
    let redis = RedisBackend::connect_with("REDIS_URL", &urls.join(","), keys, options)
        .await
        .map_err(|e| setup(&e))?;
    Ok((ProxySet::new(proxies), redis))
}

fn socket_addr(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{port}")
        .parse()
        .map_err(|e| format!("cannot proxy {host}:{port}: {e}"))
}

/// `url` with its host and port replaced by `addr` (credentials and path kept); empty when
/// `url` is not a URL.
/// `url` with its host and port replaced by `addr` (its scheme, credentials and path kept);
/// empty when `url` has no scheme.
pub fn url_with_addr(url: &str, addr: SocketAddr) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return String::new();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let credentials = authority
        .rsplit_once('@')
        .map(|(c, _)| format!("{c}@"))
        .unwrap_or_default();
    format!("{scheme}://{credentials}{addr}{tail}")
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else { continue };
        if *mode.borrow() == ProxyMode::Cut {
            drop(client);
            continue;
        }
        let mode = mode.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::select! {
                () = stop.cancelled() => {}
                () = pipe(client_read, server_write, mode.clone()) => {}
                () = pipe(server_read, client_write, mode) => {}
            }
        });
    }
}

/// Waits until the mode is `Pass`; false once it is `Cut`.
async fn until_passing(mode: &mut watch::Receiver<ProxyMode>) -> bool {
    loop {
        match *mode.borrow_and_update() {
            ProxyMode::Pass | ProxyMode::Delay(_) => return true,
            ProxyMode::Cut => return false,
            ProxyMode::Stall => {}
        }
        if mode.changed().await.is_err() {
            return false;
        }
    }
}

async fn pipe(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    mut mode: watch::Receiver<ProxyMode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !until_passing(&mut mode).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let delay = match *mode.borrow() {
            ProxyMode::Delay(delay) => Some(delay),
            _ => None,
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        // Bytes read while passing are held, not lost, if a stall begins now.
        if !until_passing(&mut mode).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
