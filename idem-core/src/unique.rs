//! The answer of the unique-constraint alternative: an idempotent create without an
//! idempotency table (each SQL store's `insert_or_fetch`).

/// What a store's `insert_or_fetch` found (the unique-constraint alternative, the repository's
/// docs/unique-constraint.md): the row, and whether this request created it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "answer Inserted, Existing and Mismatch differently"]
pub enum InsertOrFetch<T> {
    /// The row is new: this request created it (answer 201).
    Inserted(T),
    /// The row existed and the request matches it: a retry (answer 200 with the body rendered
    /// from the row, the same as the first answer's).
    Existing(T),
    /// The row existed, created by a request with other parameters: the identifier is reused,
    /// not retried (answer 422; never overwrite the row).
    Mismatch(T),
}

impl<T> InsertOrFetch<T> {
    /// The usual HTTP status: 201 for [`Inserted`](Self::Inserted), 200 for
    /// [`Existing`](Self::Existing), 422 for [`Mismatch`](Self::Mismatch).
    ///
    /// ```
    /// use idem_core::InsertOrFetch;
    /// assert_eq!(InsertOrFetch::Inserted(()).status(), 201);
    /// assert_eq!(InsertOrFetch::Existing(()).status(), 200);
    /// assert_eq!(InsertOrFetch::Mismatch(()).status(), 422);
    /// ```
    pub fn status(&self) -> u16 {
        match self {
            Self::Inserted(_) => 201,
            Self::Existing(_) => 200,
            Self::Mismatch(_) => 422,
        }
    }

    /// The row, whichever request created it.
    pub fn row(&self) -> &T {
        match self {
            Self::Inserted(row) | Self::Existing(row) | Self::Mismatch(row) => row,
        }
    }

    /// The row, whichever request created it.
    pub fn into_row(self) -> T {
        match self {
            Self::Inserted(row) | Self::Existing(row) | Self::Mismatch(row) => row,
        }
    }
}
