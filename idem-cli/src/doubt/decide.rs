//! `doubt settle` and `doubt release`: an operator's decision about one record in doubt,
//! applied by the library's one fenced path ([`resolve`]), never by writing the
//! store directly. Of two deciders that read one record, one wins; the other is told.

use super::{not_in_doubt, render::decided_text};
use crate::cli::DecisionArgs;
use crate::failure::{usage, Failure};
use crate::io::Io;
use crate::render::{bytes_json, now, printable};
use crate::store_call::deadline;
use crate::store_call::within;
use idem_core::store::{Decided, Reconciliation};
use idem_core::{is_never_stored, Error, Idempotency, Policy, RecordId, StoredResponse};
use idem_ops::reconcile::{in_doubt, resolve, Finding};
use idem_ops::Operator;
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

/// The real answer an operator gives with `--status`, `--body`/`--body-file`, `--header`.
#[derive(Debug)]
pub(super) struct Answer(StoredResponse);

impl Answer {
    /// The answer the flags describe; a header that is never stored, a header without a
    /// name, or a body file that cannot be read is a mistake on the command line.
    pub(super) fn from_flags(
        status: u16,
        body: Option<String>,
        body_file: Option<PathBuf>,
        headers: &[String],
    ) -> Result<Self, Failure> {
        let body = match (body, body_file) {
            (Some(text), _) => text.into_bytes(),
            (None, Some(path)) => read_body(&path)?,
            (None, None) => Vec::new(),
        };
        let mut response = StoredResponse::new(status, body);
        for header in headers {
            let (name, value) = parse_header(header)?;
            response = response.with_header(name, value);
        }
        Ok(Self(response))
    }
}

/// `Name: value`, the name checked against the headers idem never stores (C7).
fn parse_header(header: &str) -> Result<(&str, &str), Failure> {
    let Some((name, value)) = header.split_once(':') else {
        return Err(Failure::Usage(format!(
            "--header {:?}: write it `Name: value`",
            printable(header)
        )));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(Failure::Usage(format!(
            "--header {:?}: no name before the colon",
            printable(header)
        )));
    }
    if is_never_stored(name) {
        return Err(Failure::Usage(format!(
            "--header {}: idem never stores or replays this header (C7); leave it out",
            printable(name)
        )));
    }
    Ok((name, value.trim()))
}

/// The largest body `--body-file` reads: an answer's body, never a device or a wrong file
/// read until memory runs out.
const MAX_BODY_FILE: u64 = 64 * 1024 * 1024;

fn read_body(path: &PathBuf) -> Result<Vec<u8>, Failure> {
    let failed = |e: std::io::Error| Failure::Usage(format!("--body-file {}: {e}", path.display()));
    if path.as_os_str() == "-" {
        read_within(std::io::stdin().lock(), MAX_BODY_FILE)
    } else {
        read_within(std::fs::File::open(path).map_err(failed)?, MAX_BODY_FILE)
    }
    .map_err(|e| match e {
        Within::Io(e) => failed(e),
        Within::Over => Failure::Usage(format!(
            "--body-file {}: over {} MiB, not an answer's body",
            path.display(),
            MAX_BODY_FILE / (1024 * 1024)
        )),
    })
}

/// Why [`read_within`] failed.
enum Within {
    Io(std::io::Error),
    Over,
}

/// All of `source`, if it holds at most `limit` bytes.
fn read_within(source: impl Read, limit: u64) -> Result<Vec<u8>, Within> {
    let mut body = Vec::new();
    source
        .take(limit.saturating_add(1))
        .read_to_end(&mut body)
        .map_err(Within::Io)?;
    if u64::try_from(body.len()).unwrap_or(u64::MAX) > limit {
        return Err(Within::Over);
    }
    Ok(body)
}

/// Who decides, why, and how the library is to apply it.
#[derive(Debug)]
pub(super) struct Decision {
    by: String,
    asked: String,
    reason: String,
    audit_retention: Duration,
    timeout: Duration,
}

impl Decision {
    /// The decision the flags describe: `--reason` must say something; `--by` defaults to
    /// `operator $USER` (`operator` without `USER`). `timeout` bounds each store call.
    pub(super) fn from_flags(args: DecisionArgs, timeout: Duration) -> Result<Self, Failure> {
        let reason = args.reason.trim().to_owned();
        if reason.is_empty() {
            return Err(Failure::Usage(
                "--reason must say what you found (it is kept in the audit trail)".into(),
            ));
        }
        let by = match args.by {
            Some(by) if by.trim().is_empty() => {
                return Err(Failure::Usage("--by must name who decides".into()))
            }
            Some(by) => by.trim().to_owned(),
            None => match std::env::var("USER") {
                Ok(user) if !user.trim().is_empty() => format!("operator {}", user.trim()),
                _ => "operator".to_owned(),
            },
        };
        // What the trail keeps is what the report says: longer texts are refused, not cut.
        let asked = args.asked;
        for (flag, text, max) in [
            ("--reason", &reason, Finding::MAX_TEXT),
            ("--asked", &asked, Finding::MAX_TEXT),
            ("--by", &by, Reconciliation::MAX_BY),
        ] {
            if text.len() > max {
                return Err(Failure::Usage(format!(
                    "{flag} is {} bytes: the audit trail keeps at most {max}",
                    text.len()
                )));
            }
        }
        Ok(Self {
            by,
            asked,
            reason,
            audit_retention: args.audit_retention,
            timeout,
        })
    }

    /// The engine's policy for this decision: the retention of a settled answer, the audit
    /// entry's, each store call's deadline, and the answer's headers as given (those idem never
    /// stores were refused already).
    fn policy(&self, retention: Duration, headers: &[(String, Vec<u8>)]) -> Policy {
        headers.iter().fold(
            Policy::default()
                .retention(retention)
                .audit_retention(self.audit_retention)
                .store_timeout(self.timeout),
            |policy, (name, _)| policy.store_header(name),
        )
    }
}

/// `doubt settle`: the effect happened; `answer` replaces the answer in doubt and is replayed
/// for `retention` from now, or as long as the record had left if longer.
pub(super) async fn settle(
    store: Box<dyn Operator>,
    id: &RecordId,
    answer: Answer,
    retention: Duration,
    decision: Decision,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let policy = decision.policy(retention, &answer.0.headers);
    let finding = Finding::settled(answer.0);
    decide(store, id, policy, finding, &decision, io).await
}

/// `doubt release`: the effect did not happen; the record is deleted and the next retry
/// executes.
pub(super) async fn release(
    store: Box<dyn Operator>,
    id: &RecordId,
    decision: Decision,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let policy = decision.policy(Policy::default().retention, &[]);
    decide(store, id, policy, Finding::not_happened(), &decision, io).await
}

/// Reads the record in doubt, applies `finding` to it with [`resolve`], and says
/// what happened.
async fn decide(
    store: Box<dyn Operator>,
    id: &RecordId,
    policy: Policy,
    finding: Finding,
    decision: &Decision,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let idem = Idempotency::builder(store)
        .policy(policy)
        .without_tracing()
        .build()
        .map_err(|e| Failure::Usage(format!("--retention or --audit-retention: {e}")))?;
    let Some(case) = within(in_doubt(&idem, id)).await? else {
        let inspected = idem.store().inspect(id, deadline()).await?;
        let what = not_in_doubt(inspected.as_ref(), now());
        if io.json {
            io.json(&json!({
                "consumer": id.consumer(),
                "route": id.route(),
                "key": id.key(),
                "in_doubt": false,
                "decision": Value::Null,
                "why": what,
            }))?;
        } else {
            writeln!(
                io.err,
                "not in doubt, nothing to decide: {what}; `idem doubt show` shows its audit trail"
            )?;
        }
        return Err(Failure::NotFound);
    };
    let finding = finding
        .asked(decision.asked.clone())
        .answered(decision.reason.clone());
    // The real answer as the store keeps it (filtered by the policy), for the report.
    let settled = finding
        .response()
        .and_then(|response| idem.policy().prepare(response.clone()).ok());
    let decided = match within(resolve(&idem, &case, finding, &decision.by)).await {
        Ok(decided) => decided,
        // A settled answer the library cannot store (a header value with a control character).
        Err(error @ Error::InvalidInput { .. }) => return Err(usage(error)),
        Err(error) => {
            writeln!(
                io.err,
                "the decision may or may not have been applied: `idem doubt show` tells"
            )?;
            return Err(Failure::Idem(error));
        }
    };
    let settled = settled.filter(|_| matches!(decided, Some(Decided::Settled { .. })));
    report(
        id,
        decided,
        settled.as_ref(),
        decision,
        idem.policy().retention,
        io,
    )
}

/// Says what the decision did; a lost one (the record changed since it was read) ends with
/// [`Failure::Contested`].
fn report(
    id: &RecordId,
    decided: Option<Decided>,
    settled: Option<&StoredResponse>,
    decision: &Decision,
    retention: Duration,
    io: &mut Io<'_>,
) -> Result<(), Failure> {
    let retention_text =
        humantime::format_duration(Duration::from_secs(retention.as_secs())).to_string();
    if io.json {
        let mut value = json!({
            "consumer": id.consumer(),
            "route": id.route(),
            "key": id.key(),
            // Unknown for a lost decision: whoever won may have settled, released or deferred.
            "in_doubt": match decided {
                Some(Decided::StillUnknown { .. }) => json!(true),
                None => Value::Null,
                Some(_) => json!(false),
            },
            "decision": decided.as_ref().map_or("contested", Decided::name),
            "by": decision.by,
            "asked": decision.asked,
            "answer": decision.reason,
        });
        if let (Some(response), Value::Object(map)) = (settled, &mut value) {
            let headers: Vec<Value> = response
                .headers
                .iter()
                .map(|(name, value)| json!({ "name": name, "value": bytes_json(value) }))
                .collect();
            map.insert("status".into(), json!(response.status));
            map.insert("headers".into(), json!(headers));
            map.insert("body_bytes".into(), json!(response.body.len()));
            map.insert(
                "retention_ms".into(),
                json!(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX)),
            );
        }
        io.json(&value)?;
    } else {
        let record = format!(
            "{}  {}  {}",
            printable(id.consumer()),
            printable(id.route()),
            printable(id.key())
        );
        match (settled, &decided) {
            (Some(response), Some(decided @ Decided::Settled { .. })) => {
                writeln!(io.out, "{}: {record}", decided_text(decided))?;
                writeln!(
                    io.out,
                    "every retry with this key now gets {} ({} header{}, {} bytes of body) for {retention_text} from now, or as long as the record had left if longer",
                    response.status,
                    response.headers.len(),
                    if response.headers.len() == 1 { "" } else { "s" },
                    response.body.len()
                )?;
            }
            (_, Some(decided @ Decided::Released)) => {
                writeln!(io.out, "{}: {record}", decided_text(decided))?;
                writeln!(
                    io.out,
                    "the record is deleted: the next retry with this key executes"
                )?;
            }
            (_, Some(decided)) => writeln!(io.out, "{}: {record}", decided_text(decided))?,
            (_, None) => {}
        }
        if decided.is_some() {
            writeln!(
                io.out,
                "audit entry: by {}, asked {:?}, answer {:?}",
                printable(&decision.by),
                printable(&decision.asked),
                printable(&decision.reason)
            )?;
        }
    }
    if decided.is_none() {
        writeln!(
            io.err,
            "the record changed since it was read (someone else decided first, or its retention passed): nothing was written; `idem doubt show` shows what became of it"
        )?;
        return Err(Failure::Contested);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_as_people_write_them() {
        assert!(matches!(
            parse_header("Content-Type: application/json"),
            Ok(("Content-Type", "application/json"))
        ));
        assert!(matches!(parse_header("x-a:b:c"), Ok(("x-a", "b:c"))));
        for bad in ["no colon", ": value", "Set-Cookie: s=1"] {
            assert!(matches!(parse_header(bad), Err(Failure::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn c12_a_body_file_is_read_within_its_limit() {
        assert!(matches!(read_within(&b"12345"[..], 5), Ok(body) if body == b"12345"));
        assert!(matches!(read_within(&b"123456"[..], 5), Err(Within::Over)));
        // An endless source (/dev/zero) ends at the limit.
        assert!(matches!(
            read_within(std::io::repeat(0), 1024),
            Err(Within::Over)
        ));
    }

    #[test]
    fn a_decision_needs_a_reason_and_names_who() {
        let args = |reason: &str, by: Option<&str>| DecisionArgs {
            reason: reason.into(),
            asked: "operator check".into(),
            by: by.map(Into::into),
            audit_retention: Duration::from_secs(3600),
        };
        let timeout = Duration::from_secs(10);
        assert!(Decision::from_flags(args("  ", None), timeout).is_err());
        assert!(Decision::from_flags(args("seen", Some(" ")), timeout).is_err());
        // What the trail would cut is refused: the report says what is kept.
        let long = "x".repeat(Finding::MAX_TEXT + 1);
        assert!(Decision::from_flags(args(&long, None), timeout).is_err());
        let long_by = "y".repeat(Reconciliation::MAX_BY + 1);
        assert!(Decision::from_flags(args("seen", Some(&long_by)), timeout).is_err());
        let decision = Decision::from_flags(args(" seen ", Some("alice")), timeout)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            (decision.by.as_str(), decision.reason.as_str()),
            ("alice", "seen")
        );
        let default =
            Decision::from_flags(args("seen", None), timeout).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(default.by.starts_with("operator"), "{}", default.by);
    }
}
