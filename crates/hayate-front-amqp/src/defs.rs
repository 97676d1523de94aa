//! What AMQP keeps of a virtual host's durable definitions in its namespace's queue store
//! (`hayate_broker::queue::store`, records of the meta log; docs/log-format.md, *Queue
//! stores*): a durable exchange (`exchange/<name>`), an exchange-to-exchange binding
//! between two durable exchanges (`edge/<source>/<destination>/<key>/<arguments hex>`) and
//! a durable queue's flags, arguments and bindings (the queue's own record). Values are
//! AMQP-encoded: `u8` version (1), then long strings (`u32` length + bytes) and field
//! tables.

use bytes::BytesMut;
use hayate_amqp::FieldTable;
use hayate_amqp::types::{Reader, Writer};
use hayate_broker::queue::store::settled::{key_part, name_of_part};

/// The version byte every value starts with.
const VERSION: u8 = 1;

/// A durable exchange a client declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExchangeDef {
    /// Its type (`direct`, `fanout`, `topic`, `headers`).
    pub(crate) kind: String,
    pub(crate) auto_delete: bool,
    pub(crate) internal: bool,
}

/// A binding of a durable queue (the default exchange's is not kept: every queue has it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BindingDef {
    pub(crate) exchange: String,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
}

/// An exchange-to-exchange binding between two durable exchanges.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EdgeDef {
    pub(crate) source: String,
    pub(crate) destination: String,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
}

/// A durable queue (its name and number are the store's).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QueueDef {
    pub(crate) auto_delete: bool,
    /// queue.declare's arguments.
    pub(crate) args: FieldTable,
    pub(crate) bindings: Vec<BindingDef>,
}

/// A field table's encoding (as in a frame, with its length).
pub(crate) fn table_bytes(t: &FieldTable) -> Vec<u8> {
    let mut b = BytesMut::new();
    Writer::new(&mut b).table(t);
    b.to_vec()
}

/// A field table as hex (what routes are told apart by, and edge keys).
pub(crate) fn table_hex(t: &FieldTable) -> String {
    table_bytes(t).iter().map(|x| format!("{x:02x}")).collect()
}

/// A field table back from [`table_bytes`].
pub(crate) fn table_of_bytes(raw: &[u8]) -> Result<FieldTable, String> {
    let mut r = Reader::new(raw);
    let t = r.table().map_err(|e| e.to_string())?;
    r.finish().map_err(|e| e.to_string())?;
    Ok(t)
}

fn writer(out: &mut BytesMut) -> Writer<'_> {
    let mut w = Writer::new(out);
    w.u8(VERSION);
    w
}

fn reader(v: &[u8]) -> Result<Reader<'_>, String> {
    let mut r = Reader::new(v);
    match r.u8().map_err(|e| e.to_string())? {
        VERSION => Ok(r),
        n => Err(format!("definition of unknown version {n}")),
    }
}

fn text(r: &mut Reader<'_>) -> Result<String, String> {
    let b = r.longstr().map_err(|e| e.to_string())?;
    String::from_utf8(b.to_vec()).map_err(|e| e.to_string())
}

fn done<T>(r: &Reader<'_>, t: T) -> Result<T, String> {
    r.finish().map_err(|e| e.to_string())?;
    Ok(t)
}

/// The key of durable exchange `name`.
pub(crate) fn exchange_key(name: &str) -> String {
    format!("exchange/{}", key_part(name))
}

/// The name of the exchange of key `key`, if it is an exchange's.
pub(crate) fn exchange_of_key(key: &str) -> Option<String> {
    key.strip_prefix("exchange/").map(name_of_part)
}

impl ExchangeDef {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = BytesMut::new();
        let mut w = writer(&mut b);
        w.longstr(self.kind.as_bytes());
        w.u8(u8::from(self.auto_delete) | (u8::from(self.internal) << 1));
        b.to_vec()
    }

    pub(crate) fn decode(v: &[u8]) -> Result<ExchangeDef, String> {
        let mut r = reader(v)?;
        let kind = text(&mut r)?;
        let flags = r.u8().map_err(|e| e.to_string())?;
        let d = ExchangeDef {
            kind,
            auto_delete: flags & 1 != 0,
            internal: flags & 2 != 0,
        };
        done(&r, d)
    }
}

impl EdgeDef {
    /// Its key: every field, so that the same binding is one record.
    pub(crate) fn key(&self) -> String {
        format!(
            "edge/{}/{}/{}/{}",
            key_part(&self.source),
            key_part(&self.destination),
            key_part(&self.key),
            table_hex(&self.args)
        )
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = BytesMut::new();
        let mut w = writer(&mut b);
        w.longstr(self.source.as_bytes());
        w.longstr(self.destination.as_bytes());
        w.longstr(self.key.as_bytes());
        w.table(&self.args);
        b.to_vec()
    }

    pub(crate) fn decode(v: &[u8]) -> Result<EdgeDef, String> {
        let mut r = reader(v)?;
        let d = EdgeDef {
            source: text(&mut r)?,
            destination: text(&mut r)?,
            key: text(&mut r)?,
            args: r.table().map_err(|e| e.to_string())?,
        };
        done(&r, d)
    }
}

impl QueueDef {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = BytesMut::new();
        let mut w = writer(&mut b);
        w.u8(u8::from(self.auto_delete));
        w.table(&self.args);
        w.u32(self.bindings.len() as u32);
        for x in &self.bindings {
            w.longstr(x.exchange.as_bytes());
            w.longstr(x.key.as_bytes());
            w.table(&x.args);
        }
        b.to_vec()
    }

    pub(crate) fn decode(v: &[u8]) -> Result<QueueDef, String> {
        let e = |e: hayate_amqp::DecodeError| e.to_string();
        let mut r = reader(v)?;
        let auto_delete = r.u8().map_err(e)? != 0;
        let args = r.table().map_err(e)?;
        let n = r.u32().map_err(e)?;
        let mut bindings = Vec::with_capacity((n as usize).min(v.len()));
        for _ in 0..n {
            bindings.push(BindingDef {
                exchange: text(&mut r)?,
                key: text(&mut r)?,
                args: r.table().map_err(e)?,
            });
        }
        done(
            &r,
            QueueDef {
                auto_delete,
                args,
                bindings,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_read_back_and_damage_is_refused() {
        let mut t = FieldTable::default();
        t.insert("x-max-length", hayate_amqp::FieldValue::I32(5));
        assert_eq!(table_of_bytes(&table_bytes(&t)).unwrap(), t);
        assert!(table_of_bytes(&[0, 0]).is_err());
        let x = ExchangeDef {
            kind: "topic".into(),
            auto_delete: false,
            internal: true,
        };
        assert_eq!(ExchangeDef::decode(&x.encode()).unwrap(), x);
        let edge = EdgeDef {
            source: "a/b".into(),
            destination: "c".into(),
            key: "k.#".into(),
            args: t.clone(),
        };
        assert_eq!(EdgeDef::decode(&edge.encode()).unwrap(), edge);
        assert!(edge.key().starts_with("edge/a%2Fb/c/k.#/"));
        let q = QueueDef {
            auto_delete: true,
            args: t.clone(),
            bindings: vec![BindingDef {
                exchange: "amq.topic".into(),
                key: "a.*".into(),
                args: FieldTable::default(),
            }],
        };
        let v = q.encode();
        assert_eq!(QueueDef::decode(&v).unwrap(), q);
        assert!(QueueDef::decode(&v[..v.len() - 1]).is_err());
        assert!(QueueDef::decode(&[2]).is_err());
        assert_eq!(
            exchange_of_key(&exchange_key("x/y")).as_deref(),
            Some("x/y")
        );
    }
}
