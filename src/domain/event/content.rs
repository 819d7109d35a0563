//! Content blocks, as clients send them: text is read, every other block is kept as it
//! came, and binary content is found in the shapes each dialect sends it in.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A content block (`{"type":"text","text":"..."}`, images, documents, ...). Only text is
/// interpreted; every other block is kept as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Block {
    pub fn text(text: impl Into<String>) -> Self {
        Block { kind: "text".into(), text: Some(text.into()), rest: Map::new() }
    }

    /// The text of all text blocks, joined.
    pub fn join_text(blocks: &[Block]) -> String {
        blocks.iter().filter_map(|b| b.text.as_deref()).collect::<Vec<_>>().join("")
    }

    /// Binary content a model provider may take, from the shapes clients send it in: a
    /// `file` block (the agent harness: `name`, and `data` as `data:<mime>;base64,<payload>`),
    /// an image as AAP sends it (`url` a `data:` URI), as Anthropic's API does (`source` of
    /// type `base64`, with `media_type` and `data`) or as ACP does (`data` in base64,
    /// `mimeType`), or an ACP `resource` holding a `blob`.
    pub fn file(&self) -> Option<File<'_>> {
        match self.kind.as_str() {
            "file" => {
                let name = text(&self.rest, "name")?;
                let (mime, base64) = data_uri(text(&self.rest, "data")?)?;
                Some(File { name, mime, base64 })
            }
            "image" if self.rest.contains_key("url") => {
                let (mime, base64) = data_uri(text(&self.rest, "url")?)?;
                Some(File { name: "image", mime, base64 })
            }
            "image" if self.rest.contains_key("source") => {
                let source = self.rest.get("source")?.as_object()?;
                if text(source, "type")? != "base64" {
                    return None;
                }
                let mime = bare_mime(text(source, "media_type")?);
                Some(File { name: "image", mime, base64: text(source, "data")? })
            }
            "image" => {
                let base64 = text(&self.rest, "data")?;
                let mime = bare_mime(text(&self.rest, "mimeType")?);
                Some(File { name: text(&self.rest, "uri").unwrap_or("image"), mime, base64 })
            }
            "resource" => {
                let resource = self.rest.get("resource")?.as_object()?;
                let base64 = text(resource, "blob")?;
                let mime = bare_mime(text(resource, "mimeType").unwrap_or("application/octet-stream"));
                Some(File { name: text(resource, "uri").unwrap_or("resource"), mime, base64 })
            }
            _ => None,
        }
    }

    /// An image given by its address, as AAP sends one (`url`, not a `data:` URI) or as
    /// Anthropic's API does (`source` of type `url`): the provider fetches it.
    pub fn image_url(&self) -> Option<&str> {
        if self.kind != "image" {
            return None;
        }
        let url = match self.rest.get("source").and_then(Value::as_object) {
            Some(source) if text(source, "type") == Some("url") => text(source, "url")?,
            Some(_) => return None,
            None => text(&self.rest, "url")?,
        };
        (!url.starts_with("data:")).then_some(url)
    }

    /// Whether the block is an image, in any shape a view stores one.
    pub fn is_image(&self) -> bool {
        self.image_url().is_some() || self.file().is_some_and(|f| f.mime.to_ascii_lowercase().starts_with("image/"))
    }

    /// Context a client attached as text (ACP's embedded text `resource` and its
    /// `resource_link`), as a model reads it.
    pub fn context(&self) -> Option<String> {
        let text = |map: &Map<String, Value>, key: &str| map.get(key).and_then(Value::as_str).map(str::to_string);
        match self.kind.as_str() {
            "resource" => {
                let resource = self.rest.get("resource")?.as_object()?;
                let (uri, body) = (text(resource, "uri").unwrap_or_default(), text(resource, "text")?);
                Some(format!("<resource uri=\"{uri}\">\n{body}\n</resource>"))
            }
            "resource_link" => {
                let uri = text(&self.rest, "uri")?;
                let name = text(&self.rest, "name").unwrap_or_else(|| uri.clone());
                Some(format!("[{name}]({uri})"))
            }
            _ => None,
        }
    }
}

fn text<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

/// `data:<mime>;base64,<payload>` as its MIME type (bare) and payload.
fn data_uri(uri: &str) -> Option<(&str, &str)> {
    let (mime, base64) = uri.strip_prefix("data:")?.split_once(";base64,")?;
    Some((bare_mime(mime), base64))
}

/// `image/png`, without parameters such as `;charset=utf-8`.
fn bare_mime(mime: &str) -> &str {
    mime.split(';').next().unwrap_or_default().trim()
}

/// A file a user message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct File<'a> {
    pub name: &'a str,
    /// The MIME type without its parameters, as sent (compare without case).
    pub mime: &'a str,
    pub base64: &'a str,
}

impl File<'_> {
    /// The file as a `data:` URI.
    pub fn data_uri(&self) -> String {
        format!("data:{};base64,{}", self.mime, self.base64)
    }

    /// What a model is told in place of a file its API cannot take.
    pub fn unsupported(&self, takes: &str) -> String {
        format!("[file {} ({}) left out: this model takes {takes}]", self.name, self.mime)
    }
}
