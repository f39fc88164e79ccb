//! The answer of the unique-constraint alternative: an idempotent create without an
//! idempotency table (each SQL store's `insert_or_fetch`).

/// What a store's `insert_or_fetch` found (docs/unique-constraint.md): the row, and whether
/// this request created it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "answer Inserted, Existing and Mismatch differently"]
pub enum InsertOrFetch<T> {
    /// The row is new: this request created it (answer 201).
    Inserted(T),
    /// The row existed and the request matches it: a retry (answer 200, rendered from the row).
    Existing(T),
    /// The row existed from a request with other parameters: a reused identifier (answer 422;
    /// never overwrite the row).
    Mismatch(T),
}

impl<T> InsertOrFetch<T> {
    /// A row already there: [`Existing`](Self::Existing) if the request matches, else
    /// [`Mismatch`](Self::Mismatch).
    ///
    /// ```
    /// use idem_core::store::InsertOrFetch;
    /// assert_eq!(InsertOrFetch::found(7, true), InsertOrFetch::Existing(7));
    /// assert_eq!(InsertOrFetch::found(7, false), InsertOrFetch::Mismatch(7));
    /// ```
    pub fn found(row: T, same_request: bool) -> Self {
        if same_request {
            Self::Existing(row)
        } else {
            Self::Mismatch(row)
        }
    }

    /// The usual HTTP status: 201, 200 or 422.
    ///
    /// ```
    /// use idem_core::store::InsertOrFetch;
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

    /// The row, owned.
    pub fn into_row(self) -> T {
        match self {
            Self::Inserted(row) | Self::Existing(row) | Self::Mismatch(row) => row,
        }
    }
}

/// For store writers: `insert_or_fetch`'s INSERT inserted nothing and its fetch found no row,
/// `attempts` times: its statements do not name the same key.
pub fn unresolved_insert_or_fetch(backend: &'static str, attempts: usize) -> crate::Error {
    crate::Error::store(
        backend,
        crate::StoreErrorKind::Misconfigured,
        format!(
            "insert_or_fetch: the INSERT inserted nothing and the fetch found no row, {attempts} times: \
             the INSERT's ON CONFLICT must name the key's constraint, and the fetch must look up the same key"
        ),
    )
}
