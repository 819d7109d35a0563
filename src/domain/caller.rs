//! Who is calling, as every layer that checks ownership sees it.

/// Who is calling: the subject of the API key, and whether it may see every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub subject: String,
    pub admin: bool,
}

impl Caller {
    /// Whether the caller may see and use what `owner` made.
    pub fn may_use(&self, owner: &str) -> bool {
        self.admin || owner == self.subject
    }
}
