//! `hayate sub --queue NAME`: a consumer of the broker's queue NAME (the queue AMQP's vhost
//! `/` and STOMP's `/queue/NAME` name too), printing `DELIVERY<TAB>new|redelivered<TAB>
//! PAYLOAD` per message and acknowledging each once printed (`--ack auto`) or as standard
//! input says (`--ack stdin`: lines `ack N`, `nack N`, `ackall N`).

use std::collections::HashMap;

use anyhow::{Result, bail};
use hayate_client::{Client, Message};

use crate::cli::SubArgs;

/// One line of standard input, read: what to do with which delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Ack(u64),
    Nack(u64),
    AckAll(u64),
}

fn parse(line: &str) -> Option<Settle> {
    let mut w = line.split_whitespace();
    let (verb, n) = (w.next()?, w.next()?.parse().ok()?);
    match verb {
        "ack" => Some(Settle::Ack(n)),
        "nack" => Some(Settle::Nack(n)),
        "ackall" => Some(Settle::AckAll(n)),
        _ => None,
    }
}

/// Standard input's lines, read on a thread of their own (the runtime has no stdin).
fn stdin_lines() -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

pub(crate) async fn run(c: &Client, name: &str, a: &SubArgs) -> Result<()> {
    let mut sub = c.consume_queue(name, a.prefetch).await?;
    c.flush().await?;
    eprintln!("consuming queue {name}");
    let by_stdin = a.ack == "stdin";
    let mut lines = if by_stdin { Some(stdin_lines()) } else { None };
    // Deliveries printed and not settled yet (stdin mode).
    let mut held: HashMap<u64, Message> = HashMap::new();
    let mut n = 0u64;
    while a.count == 0 || n < a.count || !held.is_empty() {
        let line = async {
            match lines.as_mut() {
                Some(l) => l.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            m = sub.next(), if a.count == 0 || n < a.count => {
                let Some(m) = m else {
                    bail!(
                        "connection closed: {}",
                        c.last_error().map(|e| e.to_string()).unwrap_or_default()
                    );
                };
                n += 1;
                let d = m.attrs.delivery;
                let how = if m.attrs.redelivered { "redelivered" } else { "new" };
                println!("{d}\t{how}\t{}", crate::show_payload(&m.payload));
                if by_stdin {
                    held.insert(d, m);
                } else {
                    c.ack(&m)?;
                    c.flush().await?;
                }
            }
            l = line => {
                let Some(l) = l else {
                    // Standard input closed: what is held goes back to the queue.
                    break;
                };
                match parse(&l) {
                    Some(Settle::Ack(d)) => {
                        if let Some(m) = held.remove(&d) {
                            c.ack(&m)?;
                        }
                    }
                    Some(Settle::Nack(d)) => {
                        if let Some(m) = held.remove(&d) {
                            c.nack(&m)?;
                        }
                    }
                    Some(Settle::AckAll(d)) => {
                        if let Some(m) = held.get(&d) {
                            c.ack_through(m)?;
                            held.retain(|k, _| *k > d);
                        }
                    }
                    None => eprintln!("? {l:?}: ack N, nack N or ackall N"),
                }
                c.flush().await?;
            }
        }
    }
    c.close().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_lines() {
        assert_eq!(parse("ack 3"), Some(Settle::Ack(3)));
        assert_eq!(parse(" nack 12 "), Some(Settle::Nack(12)));
        assert_eq!(parse("ackall 7"), Some(Settle::AckAll(7)));
        assert_eq!(parse("ack x"), None);
        assert_eq!(parse("drop 1"), None);
    }
}
