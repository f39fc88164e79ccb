//! The shop's tables, beside the inbox's records in the same SQLite file, and the one
//! transaction a paid order runs: the invoice, the stock and the inbox's acknowledgement commit
//! together or not at all.
//!
//! Seeded at every start (`INSERT OR IGNORE`: a restart keeps what changed):
//!
//! - `products`: `sku_tea` (8.50), `sku_mug` (12.00), `sku_kettle` (45.00), `sku_teapot`
//!   (32.00), 10,000 in stock each;
//! - `orders` `ord_1` .. `ord_1000`: order `ord_n` buys product `(n - 1) mod 4` (tea, mug,
//!   kettle, teapot for n = 1, 2, 3, 4) in a quantity of 1 + (n - 1) mod 3, priced in euros.
//!
//! A checkout puts the order id in the payment intent's metadata (`metadata.order_id`); when
//! Stripe reports the payment intent succeeded, the order gets its invoice.

use idem::inbox::Audit;
use idem::sqlite::rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use idem::sqlite::{SqliteAudit, SqliteStore};
use idem::Completion;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A failure of the shop's own SQL (the transaction rolled back; the event stays retryable).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS products (
    sku TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    unit_amount INTEGER NOT NULL,
    seeded_stock INTEGER NOT NULL,
    -- Below zero: sold on backorder. A paid order is never refused for want of stock.
    stock INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
    id TEXT PRIMARY KEY,
    sku TEXT NOT NULL REFERENCES products (sku),
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS invoices (
    id TEXT PRIMARY KEY,
    -- One invoice per order, whatever Stripe sends.
    order_id TEXT NOT NULL UNIQUE REFERENCES orders (id),
    event_id TEXT NOT NULL,
    payment_intent TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    created INTEGER NOT NULL
);";

/// The seeded products: sku, name, unit price in cents.
const PRODUCTS: [(&str, &str, i64); 4] = [
    ("sku_tea", "Assam tea, 250 g", 850),
    ("sku_mug", "Stoneware mug", 1200),
    ("sku_kettle", "Gooseneck kettle", 4500),
    ("sku_teapot", "Cast-iron teapot", 3200),
];

/// Units of each product in stock at the first start.
pub(crate) const SEEDED_STOCK: i64 = 10_000;

/// Orders `ord_1` ..= `ord_{SEEDED_ORDERS}` exist at start.
pub(crate) const SEEDED_ORDERS: u32 = 1000;

/// What a `payment_intent.succeeded` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The order got its invoice and its stock was taken.
    Invoiced {
        /// The invoice (`in_...`).
        invoice: String,
    },
    /// No such order: acknowledged, nothing to do.
    UnknownOrder,
    /// The order already had its invoice: from another event (a second payment for one order:
    /// a person must refund one), or from this one if it was resent after the inbox forgot it;
    /// acknowledged, nothing done.
    AlreadyInvoiced,
    /// The payment intent carries no `metadata.order_id`: not one of the shop's checkouts.
    NoOrderId,
    /// Another event type: acknowledged and recorded, no effect.
    Ignored,
}

impl Effect {
    /// A stable name for the log.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Effect::Invoiced { .. } => "invoiced",
            Effect::UnknownOrder => "unknown_order",
            Effect::AlreadyInvoiced => "already_invoiced",
            Effect::NoOrderId => "no_order_id",
            Effect::Ignored => "ignored",
        }
    }
}

/// The payment a `payment_intent.succeeded` reports, for [`invoice`].
#[derive(Debug, Clone)]
pub(crate) struct PaidOrder {
    /// The event (`evt_...`), kept on the invoice.
    pub event_id: String,
    /// The payment intent (`pi_...`).
    pub payment_intent: String,
    /// The order (`metadata.order_id`).
    pub order_id: String,
    /// What was received, when the event says (else the order's amount is invoiced).
    pub amount: Option<i64>,
    /// Its currency, when the event says.
    pub currency: Option<String>,
}

/// Creates the tables and seeds the products and orders (what exists is kept).
pub(crate) async fn open(store: &SqliteStore) -> Result<(), BoxError> {
    store
        .try_call(|db| {
            db.execute_batch(SCHEMA)?;
            let tx = db.transaction()?;
            for (sku, name, unit) in PRODUCTS {
                tx.execute(
                    "INSERT OR IGNORE INTO products (sku, name, unit_amount, seeded_stock, stock) VALUES (?1, ?2, ?3, ?4, ?4)",
                    params![sku, name, unit, SEEDED_STOCK],
                )?;
            }
            for n in 1..=SEEDED_ORDERS {
                let (sku, _, unit) = PRODUCTS[(n as usize - 1) % PRODUCTS.len()];
                let quantity = 1 + i64::from((n - 1) % 3);
                tx.execute(
                    "INSERT OR IGNORE INTO orders (id, sku, quantity, amount, currency) VALUES (?1, ?2, ?3, ?4, 'eur')",
                    params![format!("ord_{n}"), sku, quantity, unit * quantity],
                )?;
            }
            tx.commit()
        })
        .await?;
    Ok(())
}

/// The audit trail, in a table beside the inbox's records (`idem_records_inbox_audit`): it
/// survives restarts. It is written beside the processing, not in its transaction: a failure
/// to write it is logged and never fails a delivery.
pub(crate) async fn open_audit(store: &SqliteStore) -> Result<Arc<dyn Audit>, BoxError> {
    Ok(Arc::new(SqliteAudit::open(store).await?))
}

/// Issues the invoice of a paid order in ONE transaction on the store's writer: the invoice,
/// the stock and the inbox's acknowledgement (`completion`, written with `complete_in`) commit
/// together, or roll back together. An unknown order, or one already invoiced, commits the
/// acknowledgement alone.
pub(crate) async fn invoice(
    store: &SqliteStore,
    completion: Completion,
    paid: PaidOrder,
) -> Result<Effect, BoxError> {
    let writer = store.clone();
    store
        .call(move |db| -> Result<Effect, BoxError> {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let order: Option<(String, i64, i64, String)> = tx
                .query_row(
                    "SELECT sku, quantity, amount, currency FROM orders WHERE id = ?1",
                    [&paid.order_id],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                )
                .optional()?;
            let effect = match order {
                None => {
                    // Money was taken for an order the shop does not know: acknowledge (no
                    // redelivery can create the order) and leave it to a person.
                    tracing::warn!(
                        order = paid.order_id,
                        event = paid.event_id,
                        payment_intent = paid.payment_intent,
                        "a payment for an unknown order; acknowledged, nothing done"
                    );
                    Effect::UnknownOrder
                }
                Some((sku, quantity, order_amount, order_currency)) => {
                    let amount = paid.amount.unwrap_or(order_amount);
                    let currency = paid.currency.clone().unwrap_or(order_currency.clone());
                    if amount != order_amount || !currency.eq_ignore_ascii_case(&order_currency) {
                        tracing::warn!(
                            order = paid.order_id,
                            paid = amount,
                            paid_currency = currency,
                            due = order_amount,
                            due_currency = order_currency,
                            "the payment differs from the order's amount; invoicing what was paid"
                        );
                    }
                    let invoice = new_invoice_id();
                    let inserted = tx.execute(
                        "INSERT INTO invoices (id, order_id, event_id, payment_intent, amount, currency, created)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (order_id) DO NOTHING",
                        params![invoice, paid.order_id, paid.event_id, paid.payment_intent, amount, currency, unix_now()],
                    )?;
                    if inserted == 1 {
                        let stock: i64 = tx.query_row(
                            "UPDATE products SET stock = stock - ?1 WHERE sku = ?2 RETURNING stock",
                            params![quantity, sku],
                            |row| row.get(0),
                        )?;
                        if stock < 0 {
                            tracing::warn!(order = paid.order_id, sku, stock, "sold on backorder");
                        }
                        Effect::Invoiced { invoice }
                    } else {
                        let by: String = tx.query_row(
                            "SELECT event_id FROM invoices WHERE order_id = ?1",
                            [&paid.order_id],
                            |row| row.get(0),
                        )?;
                        if by == paid.event_id {
                            // The inbox forgot the event (a resend older than its retention):
                            // the order's UNIQUE invoice is the second line of defence.
                            tracing::info!(order = paid.order_id, event = paid.event_id, "the order's invoice exists for this very event; nothing done");
                        } else {
                            tracing::warn!(
                                order = paid.order_id,
                                event = paid.event_id,
                                invoiced_by = by,
                                "the order is already invoiced by another event: a second payment? \
                                 Nothing done; a person should refund one of them"
                            );
                        }
                        Effect::AlreadyInvoiced
                    }
                }
            };
            writer.complete_in(&tx, &completion)?; // LeaseLost: roll back
            tx.commit()?;
            Ok(effect)
        })
        .await?
}

/// The invoices, and the units they took from stock (test hooks).
pub(crate) async fn invoice_counts(store: &SqliteStore) -> Result<(i64, i64), BoxError> {
    read(store, |db| {
        let invoices = db.query_row("SELECT count(*) FROM invoices", [], |row| row.get(0))?;
        let sold = db.query_row(
            "SELECT coalesce(sum(seeded_stock - stock), 0) FROM products",
            [],
            |row| row.get(0),
        )?;
        Ok((invoices, sold))
    })
    .await
}

/// Runs a read on a connection of its own, off the async executor (WAL: a writer never
/// blocks it).
async fn read<T: Send + 'static>(
    store: &SqliteStore,
    work: impl FnOnce(&Connection) -> Result<T, BoxError> + Send + 'static,
) -> Result<T, BoxError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || work(&store.connect()?)).await?
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// `in_` and 24 random characters.
fn new_invoice_id() -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 24];
    if getrandom::fill(&mut bytes).is_err() {
        // No system randomness: a hash of the time and the thread is still unique here.
        let seed = format!("{:?}{:?}", SystemTime::now(), std::thread::current().id());
        bytes.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..24]);
    }
    let id: String = bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    format!("in_{id}")
}
