//! Compressed responses: `Content-Encoding` negotiated from the client's `Accept-Encoding`
//! among the codings `[server]` allows, with actix's own encoder.
//!
//! Bodies (pages, the console's files) may be compressed in `compress` (zstd, gzip); SSE
//! streams only in `compress_streams`, empty by default: a stream keeps its compressor for
//! as long as it is open (about 150 KiB for gzip, 830 KiB for zstd at actix's level 3),
//! which a server holding thousands of idle streams cannot afford by default. A compressed
//! stream is flushed whenever the body has nothing more ready, so a live event leaves at
//! once, and a catch-up's large writes are compressed whole. A body of a known length under
//! `compress_min_bytes` (an append's answer) is sent as it is: there compression costs more
//! than it saves.

use actix_http::encoding::Encoder;
use actix_web::body::{BodySize, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{
    self, AcceptEncoding, ContentEncoding, Encoding, Header, HeaderMap, HeaderValue, Preference, Quality,
};
use actix_web::middleware::Next;

use crate::config::{Codec, ServerSettings};

/// What `[server]` says about compression, read once.
#[derive(Debug, Clone)]
pub struct Compression {
    bodies: Vec<Encoding>,
    streams: Vec<Encoding>,
    min_bytes: u64,
}

impl Compression {
    pub fn new(server: &ServerSettings) -> Compression {
        let encodings = |codecs: &[Codec]| -> Vec<Encoding> {
            codecs
                .iter()
                .map(|codec| match codec {
                    Codec::Zstd => Encoding::zstd(),
                    Codec::Gzip => Encoding::gzip(),
                })
                .collect()
        };
        Compression {
            bodies: encodings(&server.compress),
            streams: encodings(&server.compress_streams),
            min_bytes: server.compress_min_bytes,
        }
    }

    /// The codings a response of these headers and size may have: none if it is not worth
    /// compressing (empty, small, already compressed, or of a kind that does not compress:
    /// an image other than SVG, a video or audio). Size first: an append's small answer is
    /// settled without reading its headers.
    fn allowed(&self, headers: &HeaderMap, size: BodySize) -> &[Encoding] {
        let big = match size {
            BodySize::None => false,
            BodySize::Sized(n) => n >= self.min_bytes,
            BodySize::Stream => true,
        };
        if !big || headers.contains_key(header::CONTENT_ENCODING) {
            return &[];
        }
        match headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(media_type) {
            Some(media) if !compressible(media) => &[],
            Some(media) if media.eq_ignore_ascii_case("text/event-stream") => &self.streams,
            _ => &self.bodies,
        }
    }
}

/// The coding the client prefers of `allowed` (by its q-values; on a tie zstd before gzip),
/// or identity. `*` stands for any coding it did not name. A client that refuses identity
/// too gets its answer as it is all the same: never a 406.
fn choose(accept: Option<&AcceptEncoding>, allowed: &[Encoding]) -> ContentEncoding {
    let Some(accept) = accept.filter(|_| !allowed.is_empty()) else { return ContentEncoding::Identity };
    let identity = Encoding::identity();
    if let Some(Encoding::Known(coding)) = accept.negotiate(allowed.iter().chain([&identity])) {
        if coding != ContentEncoding::Identity {
            return coding;
        }
    }
    // `*` (e.g. `identity;q=0, *`): the first allowed coding the client did not refuse by name.
    let listed = |item: &Preference<Encoding>, accepted: bool| {
        accept.0.iter().any(|q| &q.item == item && (q.quality > Quality::ZERO) == accepted)
    };
    let refused = |coding: &Encoding| listed(&Preference::Specific(coding.clone()), false);
    match allowed.iter().find(|coding| listed(&Preference::Any, true) && !refused(coding)) {
        Some(Encoding::Known(coding)) => *coding,
        _ => ContentEncoding::Identity,
    }
}

/// `text/HTML` of `text/HTML; charset=utf-8`.
fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// Whether a media type (any case) compresses: not an image other than SVG, a video or audio.
fn compressible(media: &str) -> bool {
    let under = |top: &str| media.get(..top.len()).is_some_and(|head| head.eq_ignore_ascii_case(top));
    !(under("video/") || under("audio/") || under("image/") && !media.eq_ignore_ascii_case("image/svg+xml"))
}

/// The middleware: reads what the client accepts, and wraps the body once the handler has
/// answered. (It sits outside the stall watch, which so judges the body as the handler
/// made it: a page of a known length is not watched even when it is sent compressed.)
pub async fn compress<B: MessageBody + 'static>(
    policy: std::sync::Arc<Compression>,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<Encoder<B>, B>>, actix_web::Error> {
    let accept = AcceptEncoding::parse(&req).ok();
    let response = next.call(req).await?;
    Ok(response.map_body(|head, body| {
        let allowed = policy.allowed(&head.headers, body.size());
        if allowed.is_empty() {
            return EitherBody::right(body);
        }
        match choose(accept.as_ref(), allowed) {
            ContentEncoding::Identity => {
                // Another client's Accept-Encoding may get another representation.
                head.headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
                EitherBody::right(body)
            }
            coding => EitherBody::left(Encoder::response(coding, head, body)),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    fn accept(value: &str) -> AcceptEncoding {
        let req = TestRequest::default().insert_header(("accept-encoding", value)).to_http_request();
        AcceptEncoding::parse(&req).unwrap()
    }

    #[test]
    fn the_clients_preference_among_those_allowed_and_a_star_for_the_rest() {
        let both = [Encoding::zstd(), Encoding::gzip()];
        let gzip = [Encoding::gzip()];
        for (header, allowed, expected) in [
            ("gzip, deflate, br, zstd", &both[..], ContentEncoding::Zstd),
            ("gzip, zstd;q=0.5", &both[..], ContentEncoding::Gzip),
            ("zstd", &gzip[..], ContentEncoding::Identity),
            ("br", &both[..], ContentEncoding::Identity),
            ("*", &both[..], ContentEncoding::Zstd),
            ("identity;q=0, *", &gzip[..], ContentEncoding::Gzip),
            ("zstd;q=0, *", &both[..], ContentEncoding::Gzip),
            ("zstd;q=0, gzip;q=0", &both[..], ContentEncoding::Identity),
            ("gzip", &[][..], ContentEncoding::Identity),
        ] {
            assert_eq!(choose(Some(&accept(header)), allowed), expected, "Accept-Encoding: {header}");
        }
        assert_eq!(choose(None, &both), ContentEncoding::Identity, "no Accept-Encoding");
    }

    #[test]
    fn text_json_and_event_streams_compress_media_does_not() {
        for kind in
            ["application/json", "text/event-stream", "text/html; charset=utf-8", "image/svg+xml", "text/javascript"]
        {
            assert!(compressible(media_type(kind)), "{kind}");
        }
        for kind in ["image/png", "IMAGE/JPEG", "video/mp4", "audio/ogg"] {
            assert!(!compressible(media_type(kind)), "{kind}");
        }
    }
}
