//! The tx class: tx.select, commit and rollback. A transaction holds its publishes and
//! acknowledgements ([`TxOp`]) until commit.

use hayate_amqp::{Method, ReplyCode};
use hayate_broker::Session;

use super::Conn;
use super::basic::settle;
use super::confirm::all_durable;
use super::error::{AmqpError, err, not_client};
use super::publish::Pending;

/// Operations one transaction holds, at most.
const MAX_TX_OPS: usize = 65_536;

/// What a transaction holds until tx.commit.
#[derive(Debug)]
pub(super) enum TxOp {
    Publish(Box<Pending>),
    Ack(u64, bool),
    Nack(u64, bool, bool),
}

/// Room for one more operation in a transaction?
pub(super) fn tx_room(tx: &[TxOp]) -> Result<(), AmqpError> {
    if tx.len() >= MAX_TX_OPS {
        return Err(err(
            ReplyCode::PreconditionFailed,
            format!("a transaction holds at most {MAX_TX_OPS} operations"),
        ));
    }
    Ok(())
}

/// The content bytes a transaction's publishes hold.
pub(super) fn tx_bytes(ops: &[TxOp]) -> usize {
    ops.iter()
        .map(|o| match o {
            TxOp::Publish(p) => p.body.len(),
            _ => 0,
        })
        .sum()
}

impl Conn<'_> {
    /// The tx class's methods.
    pub(super) async fn tx_class(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m {
            Method::TxSelect {} => {
                let c = self.chan(ch)?;
                if c.confirms.is_some() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "cannot switch from confirm to tx mode",
                    ));
                }
                c.tx.get_or_insert_with(Vec::new);
                self.send(session, ch, Method::TxSelectOk {});
            }
            Method::TxCommit {} | Method::TxRollback {} => {
                let c = self.chan(ch)?;
                if c.tx.is_none() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "channel is not transactional",
                    ));
                }
                let ops = c.tx.replace(Vec::new()).unwrap_or_default();
                let bytes = tx_bytes(&ops);
                if let Method::TxCommit {} = m {
                    self.tx_commit(ch, ops, bytes, session).await?;
                } else {
                    self.release_held(bytes);
                    self.send(session, ch, Method::TxRollbackOk {});
                }
            }
            m => return Err(not_client(m)),
        }
        Ok(())
    }

    /// tx.commit of `ops` (holding `bytes` of content): each done in order until one
    /// fails; commit-ok once what durable queues stored is durable.
    async fn tx_commit(
        &mut self,
        ch: u16,
        ops: Vec<TxOp>,
        bytes: usize,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        let mut result = Ok(());
        let mut waits = Vec::new();
        for op in ops {
            if result.is_err() {
                break;
            }
            result = match op {
                TxOp::Publish(p) => self.publish(ch, *p, session).await.map(|w| waits.extend(w)),
                TxOp::Ack(t, multi) => self.chan(ch).and_then(|c| settle(c, t, multi, None)),
                TxOp::Nack(t, multi, rq) => {
                    self.chan(ch).and_then(|c| settle(c, t, multi, Some(rq)))
                }
            };
        }
        self.release_held(bytes);
        result?;
        // commit-ok once what durable queues stored is durable.
        if !all_durable(waits).await {
            return Err(err(
                ReplyCode::InternalError,
                "persistent messages of the transaction could not be stored",
            ));
        }
        self.send(session, ch, Method::TxCommitOk {});
        Ok(())
    }
}
