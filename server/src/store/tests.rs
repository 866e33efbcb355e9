//! The contract every backend keeps, checked on each: the SQLite backend always, the
//! PostgreSQL one on a scratch database when `DURABLE_MCP_TEST_POSTGRES` names a server (as
//! `scripts/test` does).

use std::collections::BTreeSet;

use durable_shared::{Steer, TaskStatus};
use serde_json::json;

use super::postgres::scratch::{ScratchDatabase, TEST_SERVER_VAR};
use super::*;

mod lifecycle_model;

/// A fresh store on one backend, with what keeps its database alive.
struct Fixture {
    store: Store,
    database: Database,
    _dir: Option<tempfile::TempDir>,
    _scratch: Option<ScratchDatabase>,
}

impl Fixture {
    async fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::Sqlite(dir.path().join("t.db"));
        Fixture {
            store: Store::connect(&database, "test-node").await.unwrap(),
            database,
            _dir: Some(dir),
            _scratch: None,
        }
    }

    /// `None` when no PostgreSQL server is configured for tests.
    async fn postgres() -> Option<Fixture> {
        let scratch = ScratchDatabase::from_env().await?.unwrap();
        let database = Database::Postgres(scratch.url().to_owned());
        Some(Fixture {
            store: Store::connect(&database, "test-node").await.unwrap(),
            database,
            _dir: None,
            _scratch: Some(scratch),
        })
    }

    /// The store with pending tasks of the given ids.
    async fn with_tasks(&self, ids: &[&str]) -> Store {
        for id in ids {
            self.store.insert_task(new_task(id)).await.unwrap();
        }
        self.store.clone()
    }
}

/// One test per backend: `mod NAME { fn sqlite; fn postgres }`.
macro_rules! contract {
    ($(#[$meta:meta])* async fn $name:ident($fx:ident) $body:block) => {
        mod $name {
            use super::*;

            $(#[$meta])*
            async fn check($fx: Fixture) $body

            #[tokio::test]
            async fn sqlite() {
                check(Fixture::sqlite().await).await
            }

            #[tokio::test]
            async fn postgres() {
                match Fixture::postgres().await {
                    Some(fixture) => check(fixture).await,
                    None => eprintln!("skipped: {TEST_SERVER_VAR} names no PostgreSQL server"),
                }
            }
        }
    };
}

/// A pending task of kind `k`; the backends' own tests use it too.
pub(super) fn new_task(id: &str) -> NewTask {
    NewTask {
        id: id.into(),
        kind: "k".into(),
        owner: "o".into(),
        params: json!({"n": 1}),
        total: 10,
        checkpoint: json!({"done": 0}),
        exclusive: None,
        owner_limit: u64::MAX,
        claim: None,
    }
}

/// Step `step` of `task` under `lease`.
fn commit(task: &TaskInfo, lease: i64, step: u64) -> StepCommit {
    StepCommit {
        task: task.clone(),
        lease,
        step,
        checkpoint: json!({"done": step}).to_string(),
        progress: step,
        message: format!("step {step}"),
        result: None,
        question: None,
    }
}

/// Node `name`, with leases long enough never to lapse during a test.
fn node(name: &str) -> Claimant {
    Claimant {
        node: name.into(),
        ttl: std::time::Duration::from_secs(600),
    }
}

/// Node `name`, with leases that lapse at once.
fn fleeting(name: &str) -> Claimant {
    Claimant {
        node: name.into(),
        ttl: std::time::Duration::ZERO,
    }
}

/// Lets a lease of [`fleeting`] lapse: the database's clock counts milliseconds.
async fn lapse() {
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
}

fn ids(handles: &[TaskHandle]) -> Vec<&str> {
    handles.iter().map(|h| h.task.task_id.as_str()).collect()
}

/// An open call on task "t" of session "s", not yet bound to a stream.
fn binding(id: &str) -> CallBinding {
    CallBinding {
        id: id.into(),
        task_id: "t".into(),
        session_id: "s".into(),
        request_id: "1".into(),
        progress_token: "1".into(),
        stream_id: None,
    }
}

fn event(stream_id: &str, message: &str) -> NewEvent {
    NewEvent {
        stream_id: stream_id.into(),
        session_id: None,
        message: Some(message.into()),
        retry_ms: None,
        finishes: false,
        binding: None,
        opens: true,
    }
}

contract! {
    async fn a_held_resource_and_the_owner_limit_refuse_new_tasks_until_released(fx) {
        let store = fx.store.clone();
        let holding = |id: &str, owner: &str| NewTask {
            owner: owner.into(),
            exclusive: Some("dir/out.jsonl".into()),
            owner_limit: 2,
            ..new_task(id)
        };
        store.insert_task(holding("a", "alice")).await.unwrap();
        let refused = store.insert_task(holding("b", "bob")).await.unwrap_err();
        assert!(
            matches!(&refused, StoreError::Refused(Refusal::Held { task_id, .. }) if task_id == "a"),
            "{refused:?}"
        );
        let (_, created) = store.insert_or_get_task(holding("a", "alice")).await.unwrap();
        assert!(!created, "attaching to the holder itself is no conflict");

        store.insert_task(NewTask { owner_limit: 2, ..new_task("c") }).await.ok();
        store.insert_task(NewTask { owner: "alice".into(), owner_limit: 2, ..new_task("d") }).await.unwrap();
        assert_eq!(store.unfinished_tasks_of("alice").await.unwrap(), 2);
        let over = store.insert_task(NewTask { owner: "alice".into(), owner_limit: 2, ..new_task("e") }).await.unwrap_err();
        assert!(matches!(over, StoreError::Refused(Refusal::OwnerLimit { limit: 2 })), "{over:?}");
        let over = store.insert_or_get_task(NewTask { owner: "alice".into(), owner_limit: 2, ..new_task("e") }).await.unwrap_err();
        assert!(matches!(over, StoreError::Refused(Refusal::OwnerLimit { limit: 2 })), "{over:?}");

        // A finished holder releases both.
        let cancelled = store
            .transition("a", &[TaskStatus::Pending], TaskStatus::Cancelled)
            .await
            .unwrap();
        assert!(matches!(cancelled, Transition::Applied(_)));
        store.insert_task(holding("b", "bob")).await.unwrap();
        store.insert_task(NewTask { owner: "alice".into(), owner_limit: 2, ..new_task("e") }).await.unwrap();
        assert!(store.get_task("e").await.unwrap().is_some());
    }
}

contract! {
    async fn a_session_belongs_to_one_subject_until_deleted(fx) {
        let store = fx.store.clone();
        store.save_session("s1", "{}".into(), "2025-11-25".into()).await.unwrap();
        store.claim_session("s1", "alice").await.unwrap();
        store.claim_session("s1", "mallory").await.unwrap();
        store.claim_session("s2", "alice").await.unwrap();
        assert_eq!(store.session_subject("s1").await.unwrap().as_deref(), Some("alice"));
        assert_eq!(store.session_subject("s3").await.unwrap(), None);
        assert_eq!(store.sessions_of("alice").await.unwrap(), 2);
        assert_eq!(store.sessions_of("mallory").await.unwrap(), 0);
        store.delete_session("s1").await.unwrap();
        assert_eq!(store.session_subject("s1").await.unwrap(), None);
        assert_eq!(store.sessions_of("alice").await.unwrap(), 1);
    }
}

contract! {
    async fn only_the_latest_lease_commits_and_only_while_running(fx) {
        let store = fx.store.clone();
        store.insert_task(new_task("a")).await.unwrap();
        let first = store.claim_task("a", &node("a")).await.unwrap().unwrap();
        let second = store.claim_task("a", &node("a")).await.unwrap().unwrap();
        assert!(second.lease > first.lease);
        assert!(
            store
                .commit_step(commit(&first.info, first.lease, 1))
                .await
                .unwrap()
                .is_none()
        );
        let info = store
            .commit_step(commit(&second.info, second.lease, 1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (info.step, info.progress, info.message.as_str()),
            (1, 1, "step 1")
        );
        assert_eq!(Some(info), store.get_task("a").await.unwrap(), "the commit's answer is the row");

        const RUNNING: &[TaskStatus] = &[TaskStatus::Running];
        let paused = store
            .transition("a", RUNNING, TaskStatus::Paused)
            .await
            .unwrap();
        assert!(matches!(paused, Transition::Applied(ref t) if t.status == TaskStatus::Paused));
        assert!(
            store
                .commit_step(commit(&second.info, second.lease, 2))
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store.claim_task("a", &node("a")).await.unwrap().is_none(),
            "paused tasks are not claimed"
        );
        let row = store.get_task("a").await.unwrap().unwrap();
        assert_eq!(row.step, 1, "nothing was committed while paused");
    }
}

contract! {
    /// A claim from the row its insert answered leaves the row as `claim_task` would and
    /// answers with it; once the row is no longer that, it is a claim like any other: of a
    /// task another node took, none; of a paused one, none until it is resumed.
    async fn a_claim_from_the_known_row_is_a_claim_all_the_same(fx) {
        let store = fx.store.clone();
        let known = |info: &TaskInfo| TaskRow {
            info: info.clone(),
            checkpoint: json!({"done": 0}),
            lease: UNCLAIMED_LEASE,
        };
        let as_stored = |row: &TaskRow, stored: &TaskRow| {
            assert_eq!(
                (&row.info, &row.checkpoint, row.lease),
                (&stored.info, &stored.checkpoint, stored.lease),
                "a claim answers with the row it left"
            );
        };
        let a = store.insert_task(new_task("a")).await.unwrap();
        let row = store.claim_known(known(&a), &node("n1")).await.unwrap().unwrap();
        assert_eq!((row.info.status, row.lease), (TaskStatus::Running, FIRST_LEASE));
        as_stored(&row, &store.task_row("a").await.unwrap().unwrap());
        assert!(
            store.claim_known(known(&a), &node("n2")).await.unwrap().is_none(),
            "another node's task is not taken"
        );

        let b = store.insert_task(new_task("b")).await.unwrap();
        let (pause, resume) = (Steer::Pause, Steer::Resume);
        store.transition("b", pause.from(), pause.to()).await.unwrap();
        assert!(store.claim_known(known(&b), &node("n1")).await.unwrap().is_none());
        store.transition("b", resume.from(), resume.to()).await.unwrap();
        let row = store.claim_known(known(&b), &node("n1")).await.unwrap().unwrap();
        as_stored(&row, &store.task_row("b").await.unwrap().unwrap());
    }
}

contract! {
    /// A step that asks leaves its task `input_required` with the question, for no worker to
    /// claim; the answer to that very question makes it `pending` with the checkpoint the
    /// answer made, once: an answer naming another question, or a second one, changes nothing.
    /// A cancel clears the question, and a task waiting for input counts as unfinished.
    async fn an_answer_is_applied_once_to_the_question_asked(fx) {
        let store = fx.with_tasks(&["t", "c"]).await;
        let question = |id: &str| durable_shared::Question {
            id: id.into(),
            message: "which one?".into(),
            schema: json!({"type": "object", "properties": {"pick": {"type": "string"}}}),
        };
        for id in ["t", "c"] {
            let row = store.claim_task(id, &node("n1")).await.unwrap().unwrap();
            let mut asking = commit(&row.info, row.lease, 1);
            asking.question = Some(question("q1"));
            let info = store.commit_step(asking).await.unwrap().unwrap();
            assert_eq!(info.status, TaskStatus::InputRequired);
            assert_eq!(info.question, Some(question("q1")));
            assert_eq!(Some(info), store.get_task(id).await.unwrap());
        }
        assert_eq!(store.unfinished_tasks_of("o").await.unwrap(), 2);
        assert!(
            store.claim_task("t", &node("n2")).await.unwrap().is_none(),
            "no worker takes a task that waits for input"
        );
        assert!(store.claimable_tasks(&node("n1"), true, 10).await.unwrap().is_empty());

        let other = store.answer_question("t", "q0", json!({"answer": 0})).await.unwrap();
        assert!(matches!(other, Transition::Refused(ref t) if t.status == TaskStatus::InputRequired));
        let Transition::Applied(info) =
            store.answer_question("t", "q1", json!({"answer": 1})).await.unwrap()
        else {
            panic!("the answer to the open question is applied");
        };
        assert_eq!((info.status, info.question), (TaskStatus::Pending, None));
        let again = store.answer_question("t", "q1", json!({"answer": 2})).await.unwrap();
        assert!(matches!(again, Transition::Refused(ref t) if t.status == TaskStatus::Pending));
        let row = store.claim_task("t", &node("n1")).await.unwrap().unwrap();
        assert_eq!(row.checkpoint, json!({"answer": 1}), "the first answer, once");
        assert!(matches!(
            store.answer_question("missing", "q1", json!({})).await.unwrap(),
            Transition::NotFound
        ));

        let cancel = Steer::Cancel;
        let Transition::Applied(cancelled) =
            store.transition("c", cancel.from(), cancel.to()).await.unwrap()
        else {
            panic!("a task waiting for input can be cancelled");
        };
        assert_eq!((cancelled.status, cancelled.question), (TaskStatus::Cancelled, None));
        assert!(matches!(
            store.answer_question("c", "q1", json!({})).await.unwrap(),
            Transition::Refused(_)
        ));
    }
}

contract! {
    async fn terminal_statuses_never_change(fx) {
        let store = fx.store.clone();
        store.insert_task(new_task("a")).await.unwrap();
        let row = store.claim_task("a", &node("a")).await.unwrap().unwrap();
        let lease = row.lease;
        let mut last = commit(&row.info, lease, 1);
        last.result = Some(json!({"ok": true, "ratio": 0.1}));
        let done = store.commit_step(last).await.unwrap().unwrap();
        assert_eq!(done.status, TaskStatus::Completed);
        assert!(done.completed_at.is_some());
        assert_eq!(Some(done), store.get_task("a").await.unwrap(), "the commit's answer is the row");
        const ANY: &[TaskStatus] = &TaskStatus::ALL;
        for target in TaskStatus::ALL {
            let outcome = store.transition("a", &ANY[..3], target).await.unwrap();
            assert!(
                matches!(outcome, Transition::Refused(ref t) if t.status == TaskStatus::Completed)
            );
        }
        assert!(
            store
                .fail_task("a", lease, "late".into())
                .await
                .unwrap()
                .is_none()
        );
        assert!(store.claim_task("a", &node("a")).await.unwrap().is_none());
        assert!(matches!(
            store
                .transition("missing", ANY, TaskStatus::Paused)
                .await
                .unwrap(),
            Transition::NotFound
        ));
    }
}

contract! {
    async fn the_server_secret_is_created_once(fx) {
        let store = fx.store.clone();
        let first = store.server_secret().await.unwrap();
        drop(store);
        let reopened = Store::connect(&fx.database, "test-node").await.unwrap();
        assert_eq!(reopened.server_secret().await.unwrap(), first);
        assert_ne!(first, [0; 32]);
    }
}

contract! {
    async fn handles_are_per_owner_and_paged_in_creation_order(fx) {
        let store = fx.with_tasks(&["a", "b", "c", "x"]).await;
        for id in ["a", "b", "c"] {
            store.upsert_handle(id, "me", "tool", 60_000).await.unwrap();
        }
        store
            .upsert_handle("x", "other", "tool", 60_000)
            .await
            .unwrap();
        store
            .upsert_handle("a", "other", "tool", 60_000)
            .await
            .unwrap();
        assert!(store.handle("x", "me").await.unwrap().is_none());
        assert_eq!(
            store.handle("x", "other").await.unwrap().unwrap().requester,
            "other"
        );
        for requester in ["me", "other"] {
            let handle = store.handle("a", requester).await.unwrap().unwrap();
            assert_eq!(
                handle.requester, requester,
                "each requester has its own handle"
            );
        }

        let all = store.list_handles("me", None, 10).await.unwrap();
        let mut expected = all.clone();
        expected.sort_by(|l, r| {
            (l.task.created_at, &l.task.task_id).cmp(&(r.task.created_at, &r.task.task_id))
        });
        assert_eq!(ids(&all), ids(&expected));
        assert_eq!(all.len(), 3);
        let first = store.list_handles("me", None, 2).await.unwrap();
        let last = &first[1].task;
        let after = Some((last.created_at.timestamp_millis(), last.task_id.clone()));
        let rest = store.list_handles("me", after, 2).await.unwrap();
        assert_eq!([ids(&first), ids(&rest)].concat(), ids(&all));
    }
}

contract! {
    async fn a_list_read_page_by_page_is_the_whole_list(fx) {
        // Inserted quickly, so that many share a creation millisecond and ties are by id.
        let ids: Vec<String> = (0..7).map(|i| format!("t{i}")).collect();
        let store = fx
            .with_tasks(&ids.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        let task_ids = |tasks: &[TaskInfo]| -> Vec<String> {
            tasks.iter().map(|t| t.task_id.clone()).collect()
        };
        let whole = store.list_tasks(None, None, None, 100).await.unwrap();
        assert_eq!(whole.len(), 7);
        let mut paged = Vec::new();
        let mut after = None;
        // Three pages hold the seven; a fourth must be empty (bounded, should paging repeat).
        for _ in 0..4 {
            let page = store.list_tasks(None, None, after, 3).await.unwrap();
            let Some(last) = page.last() else { break };
            after = Some((last.created_at.timestamp_millis(), last.task_id.clone()));
            paged.extend(page);
        }
        assert_eq!(task_ids(&paged), task_ids(&whole), "every task once, in order");
        let mut newest_first = whole.clone();
        newest_first.sort_by(|l, r| {
            (std::cmp::Reverse(l.created_at), &l.task_id)
                .cmp(&(std::cmp::Reverse(r.created_at), &r.task_id))
        });
        assert_eq!(task_ids(&whole), task_ids(&newest_first));

        // A page of one status's list.
        store
            .transition("t3", &[TaskStatus::Pending], TaskStatus::Paused)
            .await
            .unwrap();
        let first = &whole[0];
        let paused_after_first = store
            .list_tasks(
                None,
                Some(TaskStatus::Paused),
                Some((first.created_at.timestamp_millis(), first.task_id.clone())),
                10,
            )
            .await
            .unwrap();
        let expected: Vec<String> = if first.task_id == "t3" { vec![] } else { vec!["t3".into()] };
        assert_eq!(task_ids(&paused_after_first), expected);
    }
}

contract! {
    async fn expired_handles_vanish_at_once_and_are_purged(fx) {
        let store = fx.with_tasks(&["a", "b"]).await;
        assert!(
            store
                .upsert_handle("a", "me", "tool", 0)
                .await
                .unwrap()
                .is_none()
        );
        store
            .upsert_handle("b", "me", "tool", 60_000)
            .await
            .unwrap();
        assert!(store.handle("a", "me").await.unwrap().is_none());
        assert_eq!(store.purge_expired_handles().await.unwrap(), 1);
        assert!(store.handle("b", "me").await.unwrap().is_some());
    }
}

contract! {
    async fn attaching_again_extends_but_never_shortens_the_ttl(fx) {
        let store = fx.with_tasks(&["a"]).await;
        let first = store
            .upsert_handle("a", "me", "tool", 60_000)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.ttl_ms, 60_000);
        let shorter = store
            .upsert_handle("a", "me", "other", 1_000)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((shorter.ttl_ms, shorter.tool.as_str()), (60_000, "tool"));
        let longer = store
            .upsert_handle("a", "me", "tool", 120_000)
            .await
            .unwrap()
            .unwrap();
        assert!(longer.ttl_ms >= 120_000, "{}", longer.ttl_ms);
    }
}

contract! {
    /// Several requests for the task of one derived id race: exactly one creates it.
    async fn racing_inserts_of_one_id_create_it_once(fx) {
        let inserts = (0..16).map(|_| {
            let store = fx.store.clone();
            tokio::spawn(async move { store.insert_or_get_task(new_task("same")).await })
        });
        let created = futures::future::join_all(inserts)
            .await
            .into_iter()
            .filter(|outcome| outcome.as_ref().unwrap().as_ref().unwrap().1)
            .count();
        assert_eq!(created, 1);
        assert!(fx.store.insert_task(new_task("same")).await.is_err());
    }
}

contract! {
    /// Concurrent appends to one stream get the seqs 1..=n, each once, and the stream's
    /// counter ends after them.
    async fn a_stream_numbers_its_events_without_gaps(fx) {
        let appends = (0..40).map(|i| {
            let store = fx.store.clone();
            tokio::spawn(async move { store.append_event(event("s", &format!("m{i}"))).await })
        });
        let appended: Vec<(String, u64)> = futures::future::join_all(appends)
            .await
            .into_iter()
            .map(|outcome| outcome.unwrap().unwrap())
            .collect();
        let token = appended[0].0.clone();
        assert!(appended.iter().all(|(t, _)| *t == token), "one stream, one token");
        let seqs: BTreeSet<u64> = appended.iter().map(|(_, seq)| *seq).collect();
        assert_eq!(seqs, (1..=40).collect());
        let stored = fx.store.events_after(&token, 0, 100).await.unwrap();
        assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
        let messages: BTreeSet<String> = stored.into_iter().filter_map(|e| e.message).collect();
        assert_eq!(messages, (0..40).map(|i| format!("m{i}")).collect());
        let after = fx.store.events_after(&token, 38, 100).await.unwrap();
        assert_eq!(after.iter().map(|e| e.seq).collect::<Vec<_>>(), [39, 40]);
        let info = fx.store.stream_info(&token).await.unwrap().unwrap();
        assert_eq!((info.next_seq, info.finished, info.session_id), (41, false, None));
    }
}

contract! {
    /// Queued events of a stream take, in order, the ids they were promised when queued; each
    /// is told durable with its id, and all are stored once `queued_durable` returns, with the
    /// session recorded after the first and nothing accepted after the final response.
    async fn queued_events_are_stored_under_the_ids_they_were_promised(fx) {
        let (told, mut durable) = tokio::sync::mpsc::unbounded_channel();
        let mut promised = Vec::new();
        for i in 0..5 {
            let mut next = event("q", &format!("m{i}"));
            next.finishes = i == 4;
            let told = told.clone();
            let id = fx
                .store
                .queue_event(next, Box::new(move |stored| {
                    let _ = told.send(stored.unwrap());
                }))
                .await
                .unwrap();
            if i == 0 {
                fx.store.queue_stream_session(&id.0, "a", "c", "p").await.unwrap();
            }
            promised.push(id);
        }
        fx.store.queued_durable().await;
        let token = promised[0].0.clone();
        assert!(promised.iter().all(|(t, _)| *t == token), "one stream, one token");
        assert_eq!(promised.iter().map(|(_, seq)| *seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        let mut durables = Vec::new();
        while let Ok(id) = durable.try_recv() {
            durables.push(id);
        }
        assert_eq!(durables, promised);
        let stored = fx.store.events_after(&token, 0, 10).await.unwrap();
        let messages: Vec<String> = stored.into_iter().filter_map(|e| e.message).collect();
        assert_eq!(messages, (0..5).map(|i| format!("m{i}")).collect::<Vec<_>>());
        let info = fx.store.stream_info(&token).await.unwrap().unwrap();
        assert_eq!((info.session_id.as_deref(), info.finished, info.next_seq), (Some("a"), true, 6));
        // A late event is refused, and its id names no stored stream.
        let (told, mut durable) = tokio::sync::mpsc::unbounded_channel();
        let late = fx
            .store
            .queue_event(event("q", "late"), Box::new(move |stored| {
                let _ = told.send(stored.is_err());
            }))
            .await;
        fx.store.queued_durable().await;
        match late {
            Ok((late, _)) => {
                assert_eq!(durable.try_recv(), Ok(true), "told the late event failed");
                assert!(fx.store.stream_info(&late).await.unwrap().is_none());
            }
            Err(e) => assert!(matches!(e, StoreError::Refused(Refusal::StreamEnded { .. })), "{e}"),
        }
    }
}

contract! {
    /// A stream belongs to the first session it is bound to; another session never gets it.
    async fn a_stream_is_bound_to_one_session(fx) {
        let (token, _) = fx.store.append_event(event("s", "m")).await.unwrap();
        assert!(fx.store.bind_stream_session(&token, "a", "c1", "p").await.unwrap());
        assert!(fx.store.bind_stream_session(&token, "a", "c2", "p").await.unwrap());
        assert!(!fx.store.bind_stream_session(&token, "b", "c3", "p").await.unwrap());
        assert!(!fx.store.bind_stream_session("unknown", "a", "c4", "p").await.unwrap());
        let mut last = event("s", "done");
        last.finishes = true;
        fx.store.append_event(last).await.unwrap();
        let info = fx.store.stream_info(&token).await.unwrap().unwrap();
        assert_eq!((info.session_id.as_deref(), info.finished), (Some("a"), true));
    }
}

contract! {
    /// Deleting a session deletes its streams, events, call bindings and subscriptions, and
    /// nothing of another session.
    async fn a_session_is_deleted_with_what_it_owns(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let mut tokens = Vec::new();
        for session in ["gone", "kept"] {
            store.save_session(session, "{}".into(), "2025-11-25".into()).await.unwrap();
            let mut first = event(&format!("{session}-stream"), "m");
            first.session_id = Some(session.into());
            tokens.push(store.append_event(first).await.unwrap().0);
            store.set_subscription(session, "task://list", true).await.unwrap();
            store
                .insert_binding(
                    CallBinding {
                        id: format!("{session}-call"),
                        task_id: "t".into(),
                        session_id: session.into(),
                        request_id: "1".into(),
                        progress_token: "1".into(),
                        stream_id: None,
                    },
                    "old-process",
                )
                .await
                .unwrap();
        }
        assert!(store.delete_session("gone").await.unwrap());
        assert!(!store.delete_session("gone").await.unwrap());
        assert_eq!(store.load_session("gone").await.unwrap(), None);
        assert_eq!(store.stream_info(&tokens[0]).await.unwrap(), None);
        assert!(!store.event_exists(&tokens[0], 1).await.unwrap());
        assert!(store.subscriptions("gone").await.unwrap().is_empty());

        assert_eq!(store.load_session("kept").await.unwrap().as_deref(), Some("{}"));
        assert!(store.event_exists(&tokens[1], 1).await.unwrap());
        assert_eq!(store.subscriptions("kept").await.unwrap(), ["task://list"]);
        let orphaned = store.adopt_orphaned_bindings("this-process").await.unwrap();
        assert_eq!(orphaned.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["kept-call"]);
    }
}

contract! {
    /// Parameters and checkpoints come back as written, each from its own column: a fraction
    /// and an integer beyond i64 keep their exact values (a JSON column type read back through
    /// a float would not).
    async fn json_comes_back_as_written(fx) {
        let mut task = new_task("j");
        task.params = serde_json::from_str(r#"{"z": 1, "a": 0.1, "big": 12345678901234567890}"#).unwrap();
        task.checkpoint = serde_json::from_str(r#"{"offset": 18446744073709551615, "rate": 1e-7}"#).unwrap();
        let stored = fx.store.insert_task(task.clone()).await.unwrap();
        assert_eq!(stored.parameters.to_string(), task.params.to_string());
        assert_eq!(Some(stored), fx.store.get_task("j").await.unwrap(), "the insert's answer is the row");
        let row = fx.store.claim_task("j", &node("a")).await.unwrap().unwrap();
        assert_eq!(row.checkpoint, task.checkpoint);
    }
}

contract! {
    /// Another node's live lease keeps a task from being claimed (its own node may take it
    /// over); once it lapses, another node claims the task and fences the first one out.
    async fn only_a_lapsed_lease_is_claimed_by_another_node(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let first = store.claim_task("t", &node("a")).await.unwrap().unwrap();
        assert_eq!(first.info.node.as_deref(), Some("a"));
        assert!(store.claim_task("t", &node("b")).await.unwrap().is_none());
        assert!(store.claimable_tasks(&node("b"), false, 10).await.unwrap().is_empty());
        assert_eq!(
            store.claimable_tasks(&node("a"), true, 10).await.unwrap(),
            [("t".to_owned(), "k".to_owned())],
            "a node restarted under its id finds its own tasks"
        );

        let again = store.claim_task("t", &fleeting("a")).await.unwrap().unwrap();
        assert!(again.lease > first.lease, "a superseding worker of the same node");
        lapse().await;
        assert_eq!(store.claimable_tasks(&node("b"), false, 10).await.unwrap().len(), 1);
        let taken = store.claim_task("t", &node("b")).await.unwrap().unwrap();
        assert_eq!(taken.info.node.as_deref(), Some("b"));
        assert!(store.commit_step(commit(&again.info, again.lease, 1)).await.unwrap().is_none());
        assert!(
            store
                .renew_leases(&node("a"), vec![("t".into(), again.lease)])
                .await
                .unwrap()
                .is_empty(),
            "the first node learns that it lost the task"
        );
        let info = store.commit_step(commit(&taken.info, taken.lease, 1)).await.unwrap().unwrap();
        assert_eq!((info.step, info.node.as_deref()), (1, Some("b")));
    }
}

contract! {
    /// A task stored claimed is fenced exactly as one claimed after its insert: running under
    /// the first lease of its node, which commits, while another node takes it only once that
    /// lease lapses, and the first lease is then fenced out.
    async fn a_task_stored_claimed_holds_its_first_lease(fx) {
        let store = fx.store.clone();
        let claimed = |id: &str, claimant: Claimant| NewTask {
            claim: Some(claimant),
            ..new_task(id)
        };
        let info = store.insert_task(claimed("t", node("a"))).await.unwrap();
        assert_eq!((info.status, info.node.as_deref()), (TaskStatus::Running, Some("a")));
        assert_eq!(Some(&info), store.get_task("t").await.unwrap().as_ref(), "the insert's answer is the row");
        assert!(store.claim_task("t", &node("b")).await.unwrap().is_none());
        assert!(store.claimable_tasks(&node("b"), false, 10).await.unwrap().is_empty());
        let committed = store.commit_step(commit(&info, FIRST_LEASE, 1)).await.unwrap();
        assert_eq!(committed.map(|info| info.step), Some(1));

        let first = store.insert_task(claimed("u", fleeting("a"))).await.unwrap();
        lapse().await;
        let taken = store.claim_task("u", &node("b")).await.unwrap().unwrap();
        assert!(taken.lease > FIRST_LEASE, "{}", taken.lease);
        assert!(store.commit_step(commit(&first, FIRST_LEASE, 1)).await.unwrap().is_none());
        assert_eq!(taken.checkpoint, json!({"done": 0}), "the first checkpoint, as stored");
    }
}

contract! {
    /// A renewed lease stays its node's; a released one is claimed by another node at once.
    async fn renewed_leases_hold_and_released_ones_pass_on(fx) {
        let store = fx.with_tasks(&["t", "u"]).await;
        let t = store.claim_task("t", &fleeting("a")).await.unwrap().unwrap();
        let u = store.claim_task("u", &fleeting("a")).await.unwrap().unwrap();
        let renewed = store
            .renew_leases(&node("a"), vec![("t".into(), t.lease), ("u".into(), u.lease + 1)])
            .await
            .unwrap();
        assert_eq!(renewed, ["t"], "a lease is renewed only under its own attempt");
        lapse().await;
        assert!(store.claim_task("t", &node("b")).await.unwrap().is_none());
        assert!(store.claim_task("u", &node("b")).await.unwrap().is_some());

        assert_eq!(store.release_leases("a").await.unwrap(), 1);
        assert!(store.claim_task("t", &node("b")).await.unwrap().is_some());
    }
}

contract! {
    /// At start, SQLite (one process per file) frees every lease; PostgreSQL (other nodes may
    /// live) frees none.
    async fn stale_leases_are_freed_only_where_no_other_node_can_live(fx) {
        let store = fx.with_tasks(&["t"]).await;
        store.claim_task("t", &node("a")).await.unwrap().unwrap();
        let released = store.release_stale_leases().await.unwrap();
        let claimed = store.claim_task("t", &node("b")).await.unwrap();
        match store.changes() {
            None => assert_eq!((released, claimed.is_some()), (1, true)),
            Some(_) => assert_eq!((released, claimed.is_some()), (0, false)),
        }
    }
}

contract! {
    /// An open binding whose handler died is adopted by one process; one whose handler is
    /// alive (on PostgreSQL, where other processes may be) is left alone.
    async fn orphaned_calls_are_adopted_once(fx) {
        let store = fx.with_tasks(&["t"]).await;
        store.keep_alive("alive", std::time::Duration::from_secs(600)).await.unwrap();
        store.insert_binding(binding("of-the-dead"), "dead").await.unwrap();
        store.insert_binding(binding("of-the-living"), "alive").await.unwrap();
        let (first, second) = tokio::join!(
            store.adopt_orphaned_bindings("one"),
            store.adopt_orphaned_bindings("two"),
        );
        let mut adopted: Vec<String> = first
            .unwrap()
            .into_iter()
            .chain(second.unwrap())
            .map(|b| b.id)
            .collect();
        adopted.sort();
        adopted.dedup();
        let expected: &[&str] = match store.changes() {
            // One process per file: "alive" is a previous process, so dead too.
            None => &["of-the-dead", "of-the-living"],
            Some(_) => &["of-the-dead"],
        };
        assert_eq!(adopted, expected);
        store.finish_binding("of-the-dead").await.unwrap();
        assert!(
            store
                .adopt_orphaned_bindings("three")
                .await
                .unwrap()
                .iter()
                .all(|b| b.id != "of-the-dead"),
            "an answered call is nobody's to finish"
        );
    }
}

contract! {
    /// A node restarted under its id announces its earlier process dead: that process's calls
    /// are adopted at once, while another live node's are left to it.
    async fn a_restarted_node_adopts_its_predecessors_calls_at_once(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let long = std::time::Duration::from_secs(600);
        store.keep_alive("n1/killed", long).await.unwrap();
        store.keep_alive("n10/alive", long).await.unwrap();
        store.insert_binding(binding("of-the-killed"), "n1/killed").await.unwrap();
        store.insert_binding(binding("of-another-node"), "n10/alive").await.unwrap();
        store.keep_alive("n1/restarted", long).await.unwrap();
        let mut adopted: Vec<String> = store
            .adopt_orphaned_bindings("n1/restarted")
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.id)
            .collect();
        let expected: &[&str] = match store.changes() {
            // One process per file: every earlier one is dead.
            None => &["of-another-node", "of-the-killed"],
            Some(_) => &["of-the-killed"],
        };
        adopted.sort();
        assert_eq!(adopted, expected);
    }
}

contract! {
    /// A call that died after its stream's priming event went out, before its first progress
    /// notification linked binding and stream, is still adopted with its stream: its client
    /// may resume from the priming event.
    async fn a_call_that_died_before_its_first_progress_is_adopted_with_its_stream(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let mut priming = event("post-stream", "");
        priming.message = None;
        let (token, _) = store.append_event(priming).await.unwrap();
        assert!(store.bind_stream_session(&token, "s", "the-call", "dead").await.unwrap());
        store.insert_binding(binding("the-call"), "dead").await.unwrap();
        store.insert_binding(binding("streamless"), "dead").await.unwrap();
        let mut adopted: Vec<(String, Option<String>)> = store
            .adopt_orphaned_bindings("restarted")
            .await
            .unwrap()
            .into_iter()
            .map(|b| (b.id, b.stream_id))
            .collect();
        adopted.sort();
        assert_eq!(
            adopted,
            [("streamless".into(), None), ("the-call".into(), Some("post-stream".into()))]
        );
    }
}

contract! {
    /// A bound call is answered exactly when its response is stored: until then a restart
    /// adopts it (the soak found calls whose binding was closed before a kill cut off their
    /// response, so no restart answered them and their resumed streams waited for ever), and
    /// the response closes it in the same commit, whether the HTTP layer named the stream's
    /// call or only the call's first progress notification did.
    async fn a_calls_response_closes_its_binding_as_it_is_stored(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let mut priming = event("named", "");
        priming.message = None;
        let (token, _) = store.append_event(priming).await.unwrap();
        assert!(store.bind_stream_session(&token, "s", "named-call", "p1").await.unwrap());
        store.insert_binding(binding("named-call"), "p1").await.unwrap();
        store.insert_binding(binding("linked-call"), "p1").await.unwrap();
        store.insert_binding(binding("unanswered"), "p1").await.unwrap();
        let mut progress = event("linked", "progress");
        progress.binding = Some("linked-call".into());
        store.append_event(progress).await.unwrap();
        store.append_event(event("unlinked", "progress")).await.unwrap();
        let open = |adopted: Vec<CallBinding>| {
            let mut ids: Vec<String> = adopted.into_iter().map(|b| b.id).collect();
            ids.sort();
            ids
        };
        assert_eq!(
            open(store.adopt_orphaned_bindings("p2").await.unwrap()),
            ["linked-call", "named-call", "unanswered"],
            "no call is answered before its response is stored"
        );

        for stream in ["named", "linked", "unlinked"] {
            let mut response = event(stream, "response");
            response.finishes = true;
            store.append_event(response).await.unwrap();
        }
        assert_eq!(
            open(store.adopt_orphaned_bindings("p3").await.unwrap()),
            ["unanswered"],
            "each stored response closed its own call's binding, and no other"
        );
    }
}

contract! {
    /// A request's stream whose process died before storing the answer, and that no open call
    /// binding will answer, is abandoned; the streams of a live process, of an open binding,
    /// with their answer, or of no request are not.
    async fn a_stream_nobody_will_answer_is_abandoned(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let mut tokens = Vec::new();
        for (stream, call) in [("lost", "c-lost"), ("relayed", "c-relayed"), ("answered", "c-answered")] {
            let mut priming = event(stream, "");
            priming.message = None;
            let (token, _) = store.append_event(priming).await.unwrap();
            assert!(store.bind_stream_session(&token, "s", call, "dead").await.unwrap());
            tokens.push(token);
        }
        store.insert_binding(binding("c-relayed"), "dead").await.unwrap();
        let mut response = event("answered", "response");
        response.finishes = true;
        store.append_event(response).await.unwrap();
        let (standalone, _) = store.append_event(event("s:common", "note")).await.unwrap();
        let abandoned = |token: String, instance: &'static str| {
            let store = store.clone();
            async move { store.abandoned(&token, instance).await.unwrap() }
        };
        assert!(abandoned(tokens[0].clone(), "restarted").await, "its handler died unanswered");
        assert!(!abandoned(tokens[0].clone(), "dead").await, "its own process is alive");
        assert!(!abandoned(tokens[1].clone(), "restarted").await, "a relay answers it");
        assert!(!abandoned(tokens[2].clone(), "restarted").await, "it has its answer");
        assert!(!abandoned(standalone, "restarted").await, "no request's stream");
        assert!(!abandoned("unknown".into(), "restarted").await);
    }
}

contract! {
    /// A stream takes no event after its final response, and an event that may not open its
    /// stream (the relay's) finds none to continue once the session took it away.
    async fn an_ended_or_deleted_stream_takes_no_more_events(fx) {
        let store = fx.store.clone();
        let (token, _) = store.append_event(event("s", "progress")).await.unwrap();
        let mut last = event("s", "response");
        last.finishes = true;
        store.append_event(last).await.unwrap();
        let refused = store.append_event(event("s", "late")).await;
        assert!(
            matches!(refused, Err(StoreError::Refused(Refusal::StreamEnded { .. }))),
            "{refused:?}"
        );
        let stored = store.events_after(&token, 0, 10).await.unwrap();
        assert_eq!(stored.len(), 2, "nothing after the response");

        let mut relayed = event("gone", "progress");
        relayed.opens = false;
        let refused = store.append_event(relayed.clone()).await;
        assert!(
            matches!(refused, Err(StoreError::Refused(Refusal::StreamEnded { .. }))),
            "{refused:?}"
        );
        store.append_event(event("gone", "first")).await.unwrap();
        let (_, seq) = store.append_event(relayed).await.unwrap();
        assert_eq!(seq, 2, "an existing stream is continued");
    }
}

contract! {
    /// Pruning deletes old events, then the old streams they leave empty and the answered
    /// bindings of their time, a bounded number of rows per transaction; what is newer, or
    /// still open, stays.
    async fn pruning_deletes_what_is_old_in_small_transactions(fx) {
        let store = fx.with_tasks(&["t"]).await;
        let old_events = 2 * PRUNE_BATCH + 10;
        let appends = (0..old_events).map(|i| {
            let store = store.clone();
            async move { store.append_event(event("old", &format!("m{i}"))).await.unwrap() }
        });
        let old_token = futures::future::join_all(appends).await[0].0.clone();
        store
            .append_event(NewEvent { finishes: true, ..event("old", "done") })
            .await
            .unwrap();
        // A quiet stream still open (a session's standalone stream) outlives its events.
        let (quiet_token, _) = store.append_event(event("quiet", "m")).await.unwrap();
        store.insert_binding(binding("answered"), "p").await.unwrap();
        store.insert_binding(binding("open"), "p").await.unwrap();
        store.finish_binding("answered").await.unwrap();
        lapse().await;
        let cutoff = now_ms();
        lapse().await;
        let (new_token, _) = store.append_event(event("new", "m")).await.unwrap();

        let pruned = store.prune_before(cutoff).await.unwrap();
        // Events: two full transactions and a partial one; streams and bindings: one each.
        assert_eq!(
            pruned,
            Pruned { events: old_events as u64 + 2, streams: 1, bindings: 1, batches: 5 }
        );
        assert_eq!(store.stream_info(&old_token).await.unwrap(), None);
        assert!(store.stream_info(&quiet_token).await.unwrap().is_some());
        store.append_event(NewEvent { opens: false, ..event("quiet", "later") }).await.unwrap();
        assert!(store.event_exists(&new_token, 1).await.unwrap());
        let open = store.adopt_orphaned_bindings("next").await.unwrap();
        assert_eq!(open.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["open"]);
        assert_eq!(store.prune_before(cutoff).await.unwrap().events, 0);
    }
}
