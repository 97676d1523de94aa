//! Errors: [`AmqpError`] (a soft error closes the channel, a hard one the connection) and
//! how a connection ends ([`End`]).

use hayate_amqp::{DecodeError, Method, ReplyCode, ShortStr};

/// An error: its code, text, and the method it answers.
#[derive(Debug, Clone)]
pub(crate) struct AmqpError {
    pub(super) code: ReplyCode,
    pub(super) text: String,
    pub(super) class: u16,
    pub(super) method: u16,
}

pub(super) fn err(code: ReplyCode, text: impl Into<String>) -> AmqpError {
    AmqpError {
        code,
        text: text.into(),
        class: 0,
        method: 0,
    }
}

impl AmqpError {
    pub(super) fn on(mut self, m: &Method) -> AmqpError {
        (self.class, self.method) = m.ids();
        self
    }

    /// The error as an answer to basic.publish (its content is what failed).
    pub(super) fn at_publish(self) -> AmqpError {
        AmqpError {
            class: 60,
            method: 40,
            ..self
        }
    }

    pub(super) fn reply_text(&self) -> ShortStr {
        ShortStr::lit(&format!("{} - {}", self.code.name(), self.text))
    }
}

/// How a connection ends.
#[derive(Debug)]
pub(crate) enum End {
    /// connection.close answered, the client went away, or shutdown.
    Done,
    /// Not AMQP 0-9-1: answer with our protocol header.
    BadHeader,
    /// A hard error: connection.close with it.
    Hard(AmqpError),
}

pub(super) fn decode_error(e: &DecodeError) -> AmqpError {
    let mut a = err(e.reply_code(), e.to_string());
    if let DecodeError::UnknownMethod { class, method } = e {
        a.class = *class;
        a.method = *method;
    }
    a
}

pub(super) fn refuse_syntax(why: String) -> End {
    End::Hard(err(ReplyCode::SyntaxError, why))
}

/// A method a client does not send (or not on a channel).
pub(super) fn not_client(m: &Method) -> AmqpError {
    err(
        ReplyCode::CommandInvalid,
        format!("{} is not a client method", m.name()),
    )
}
