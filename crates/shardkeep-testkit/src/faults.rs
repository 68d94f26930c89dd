//! A TCP proxy that injects store outages: between a client and Postgres or Redis it can pass
//! traffic, stall it (bytes held, connections open — a wedged store), or cut it (every
//! connection closed, new ones refused — a store that went away). Used by the tests and the
//! simulator so outages never require stopping a shared server.

use std::net::SocketAddr;

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
