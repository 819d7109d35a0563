//! Compressed responses: `Content-Encoding` negotiated from the client's `Accept-Encoding`
//! among the codings `[server] compress` allows (zstd, gzip), with actix's own encoder.
//!
//! A stream (SSE) is compressed as it goes: the encoder flushes whenever the body has nothing
//! more ready, so a live event leaves at once, and a catch-up's large writes are compressed
//! whole. A body of a known length under `compress_min_bytes` (an append's answer) is sent
//! as it is: there compression costs more than it saves.

use actix_http::encoding::Encoder;
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, AcceptEncoding, ContentEncoding, Encoding, Header, HeaderValue};
use actix_web::middleware::Next;

use crate::config::{Codec, ServerSettings};

/// What `[server]` says about compression, read once.
#[derive(Debug, Clone)]
pub struct Compression {
    /// Never empty: identity is always acceptable as a last resort.
    supported: Vec<Encoding>,
    min_bytes: u64,
}

impl Compression {
    pub fn new(server: &ServerSettings) -> Compression {
        let mut supported: Vec<Encoding> = server
            .compress
            .iter()
            .map(|codec| match codec {
                Codec::Zstd => Encoding::zstd(),
                Codec::Gzip => Encoding::gzip(),
            })
            .collect();
        supported.push(Encoding::identity());
        Compression { supported, min_bytes: server.compress_min_bytes }
    }

    /// The coding for a request: the client's preferred of those allowed (by its q-values;
    /// on a tie zstd before gzip), or none.
    fn choose(&self, req: &ServiceRequest) -> ContentEncoding {
        match AcceptEncoding::parse(req).ok().and_then(|accept| accept.negotiate(self.supported.iter())) {
            Some(Encoding::Known(coding)) => coding,
            // No header, none acceptable, or only identity: sent as it is (never a 406: a
            // client that refuses identity too still gets its answer).
            _ => ContentEncoding::Identity,
        }
    }

    /// Whether a body is worth compressing: not empty, not small, not already compressed,
    /// and of a kind that compresses (not an image other than SVG, a video or audio).
    fn worth(&self, headers: &header::HeaderMap, size: BodySize) -> bool {
        if self.supported.len() == 1 {
            return false; // `compress = []`
        }
        let big = match size {
            BodySize::None => false,
            BodySize::Sized(n) => n >= self.min_bytes,
            BodySize::Stream => true,
        };
        big && !headers.contains_key(header::CONTENT_ENCODING)
            && headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_none_or(compressible)
    }
}

fn compressible(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    !(media.starts_with("video/")
        || media.starts_with("audio/")
        || media.starts_with("image/") && media != "image/svg+xml")
}

/// The middleware: picks the coding before the handler runs, and wraps the body after.
pub async fn compress(
    policy: std::sync::Arc<Compression>,
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<EitherBody<Encoder<BoxBody>, BoxBody>>, actix_web::Error> {
    let coding = policy.choose(&req);
    let response = next.call(req).await?;
    Ok(response.map_body(|head, body| {
        if !policy.worth(&head.headers, body.size()) {
            return EitherBody::right(body);
        }
        if coding == ContentEncoding::Identity {
            // Another client's Accept-Encoding may get another representation.
            head.headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
            return EitherBody::right(body);
        }
        EitherBody::left(Encoder::response(coding, head, body))
    }))
}

#[cfg(test)]
mod tests {
    use super::compressible;

    #[test]
    fn text_json_and_event_streams_compress_media_does_not() {
        for kind in
            ["application/json", "text/event-stream", "text/html; charset=utf-8", "image/svg+xml", "text/javascript"]
        {
            assert!(compressible(kind), "{kind}");
        }
        for kind in ["image/png", "IMAGE/JPEG", "video/mp4", "audio/ogg"] {
            assert!(!compressible(kind), "{kind}");
        }
    }
}
