//! The task lifecycle as a state machine, checked against a model: random sequences of what
//! workers, clients and restarts do to one task (claims by two nodes, step commits and
//! completion under current or stale leases, questions asked and answered, failures, pause,
//! resume and cancel, lease renewals, a node handing its leases back, a process restarting on
//! the SQLite file) are
//! applied to the store and to a few lines of plain Rust, and after every operation both agree
//! on whether it was applied and on the task's status and step.
//!
//! The model is the rules as `ARCHITECTURE.md` states them: pause from `pending` or
//! `running`, resume from `paused`, cancel from any unfinished status (the store is asked with
//! [`Steer`]'s table, so a change to the table shows as a disagreement); a claim takes a `pending` task, or a `running` one whose lease lapsed or
//! is its own node's, and bumps the attempt; a step commit (one that asks a question too, which
//! leaves the task `input_required`) or a failure needs the current attempt on a `running`
//! task; an answer needs the question asked last to be open, and makes the task `pending`; a
//! terminal status is never left. The task's owner counts it as unfinished exactly while
//! its status is not terminal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable_shared::Steer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

use super::*;

/// One of the two nodes of a case.
type Node = usize;

#[derive(Debug, Clone)]
enum Op {
    /// A worker of `node` claims the task.
    Claim(Node),
    /// The latest worker (or, `stale`, the one before it) commits a step; `last` completes.
    Commit { stale: bool, last: bool },
    /// The latest worker (or the one before it) reports the step failed.
    Fail { stale: bool },
    /// The latest worker (or the one before it) commits a step that asks a question.
    Ask { stale: bool },
    /// A person answers the question asked last (or, `earlier`, the one before it).
    Answer { earlier: bool },
    /// A client pauses, resumes or cancels.
    Steer(Steer),
    /// `node` renews the lease of the latest attempt (or of the one before it).
    Renew { node: Node, stale: bool },
    /// `node` stops gracefully, handing its leases back.
    Release(Node),
    /// A new process starts on the SQLite file: every lease is released.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize).prop_map(Op::Claim),
        4 => (any::<bool>(), prop::bool::weighted(0.15))
            .prop_map(|(stale, last)| Op::Commit { stale, last }),
        1 => any::<bool>().prop_map(|stale| Op::Fail { stale }),
        2 => any::<bool>().prop_map(|stale| Op::Ask { stale }),
        2 => prop::bool::weighted(0.2).prop_map(|earlier| Op::Answer { earlier }),
        3 => prop::sample::select(Steer::ALL.to_vec()).prop_map(Op::Steer),
        1 => (0..2usize, any::<bool>()).prop_map(|(node, stale)| Op::Renew { node, stale }),
        1 => (0..2usize).prop_map(Op::Release),
        1 => Just(Op::Restart),
    ]
}

/// What the rules say the task is.
#[derive(Debug, Clone, PartialEq)]
struct Model {
    status: TaskStatus,
    /// The attempt of the latest claim (0: never claimed).
    lease: i64,
    /// The node of the latest claim.
    node: Option<Node>,
    /// Whether that lease was released (a restart, a graceful stop): anyone may claim.
    lapsed: bool,
    step: u64,
    /// Questions asked so far; the last one is open while the task is `input_required`.
    asked: u64,
    /// Whether a restart releases every lease: on SQLite (one process owns the file); on
    /// PostgreSQL another node's lease lapses only by the clock.
    restart_releases: bool,
}

impl Model {
    fn new(restart_releases: bool) -> Model {
        Model {
            status: TaskStatus::Pending,
            lease: 0,
            node: None,
            lapsed: false,
            step: 0,
            asked: 0,
            restart_releases,
        }
    }

    fn holds(&self, lease: i64) -> bool {
        self.status == TaskStatus::Running && lease == self.lease
    }

    /// Applies `op`; returns whether the rules allow it.
    fn apply(&mut self, op: &Op) -> bool {
        let lease_of = |stale: bool| if stale { self.lease - 1 } else { self.lease };
        match *op {
            Op::Claim(node) => {
                let ok = self.status == TaskStatus::Pending
                    || (self.status == TaskStatus::Running
                        && (self.node == Some(node) || self.lapsed));
                if ok {
                    self.status = TaskStatus::Running;
                    self.lease += 1;
                    self.node = Some(node);
                    self.lapsed = false;
                }
                ok
            }
            Op::Commit { stale, last } => {
                let ok = self.holds(lease_of(stale));
                if ok {
                    self.step += 1;
                    if last {
                        self.status = TaskStatus::Completed;
                    }
                }
                ok
            }
            Op::Fail { stale } => {
                let ok = self.holds(lease_of(stale));
                if ok {
                    self.status = TaskStatus::Failed;
                }
                ok
            }
            Op::Ask { stale } => {
                let ok = self.holds(lease_of(stale));
                if ok {
                    self.step += 1;
                    self.asked += 1;
                    self.status = TaskStatus::InputRequired;
                }
                ok
            }
            Op::Answer { earlier } => {
                let ok = self.status == TaskStatus::InputRequired && !earlier;
                if ok {
                    self.status = TaskStatus::Pending;
                }
                ok
            }
            // Spelled out here rather than read from `Steer`'s table, so that a change to the
            // table is a disagreement too.
            Op::Steer(steer) => {
                let to = match (steer, self.status) {
                    (Steer::Pause, TaskStatus::Pending | TaskStatus::Running) => TaskStatus::Paused,
                    (Steer::Resume, TaskStatus::Paused) => TaskStatus::Pending,
                    (Steer::Cancel, status) if !status.is_terminal() => TaskStatus::Cancelled,
                    _ => return false,
                };
                self.status = to;
                true
            }
            Op::Renew { node, stale } => {
                let ok = self.holds(lease_of(stale)) && self.node == Some(node);
                if ok {
                    self.lapsed = false;
                }
                ok
            }
            Op::Release(node) => {
                let ok = self.status == TaskStatus::Running && self.node == Some(node);
                if ok {
                    self.lapsed = true;
                }
                ok
            }
            Op::Restart => {
                if self.restart_releases && self.status == TaskStatus::Running {
                    self.lapsed = true;
                }
                true
            }
        }
    }
}

/// What each attempt's worker knows of the task, by lease: the row its claim answered, then
/// each of its commits' answers. A worker commits with its own view (see `StepCommit::task`).
type Views = HashMap<i64, TaskInfo>;

/// The view the worker of `lease` commits with: its own, or the stored row for an attempt no
/// claim made (such a commit is refused).
async fn view(store: &Store, id: &str, views: &Views, lease: i64) -> TaskInfo {
    match views.get(&lease) {
        Some(view) => view.clone(),
        None => store.get_task(id).await.unwrap().unwrap(),
    }
}

/// Applies `op` to the store; returns whether it was applied.
async fn apply(
    store: &Store,
    id: &str,
    nodes: &[Claimant; 2],
    model: &Model,
    views: &mut Views,
    op: &Op,
) -> bool {
    let lease_of = |stale: bool| if stale { model.lease - 1 } else { model.lease };
    match *op {
        Op::Claim(node) => {
            let row = store.claim_task(id, &nodes[node]).await.unwrap();
            if let Some(row) = &row {
                views.insert(row.lease, row.info.clone());
                assert_eq!(row.lease, model.lease + 1, "a claim bumps the attempt");
                let stored = store.task_row(id).await.unwrap().unwrap();
                assert_eq!(
                    (&row.info, &row.checkpoint, row.lease),
                    (&stored.info, &stored.checkpoint, stored.lease),
                    "a claim answers with the row it left"
                );
            }
            row.is_some()
        }
        Op::Commit { stale, last } => {
            let lease = lease_of(stale);
            let mut commit = commit(&view(store, id, views, lease).await, lease, model.step + 1);
            if last {
                commit.result = Some(json!({"done": true}));
            }
            committed(store, id, views, commit).await
        }
        Op::Fail { stale } => store
            .fail_task(id, lease_of(stale), "step failed".into())
            .await
            .unwrap()
            .is_some(),
        Op::Ask { stale } => {
            let lease = lease_of(stale);
            let mut commit = commit(&view(store, id, views, lease).await, lease, model.step + 1);
            commit.question = Some(question(model.asked + 1));
            committed(store, id, views, commit).await
        }
        Op::Answer { earlier } => {
            let asked = if earlier {
                model.asked.saturating_sub(1)
            } else {
                model.asked
            };
            let answered = store
                .answer_question(id, &question(asked).id, json!({"answer": asked}))
                .await
                .unwrap();
            matches!(answered, Transition::Applied(_))
        }
        Op::Steer(steer) => match store
            .transition(id, steer.from(), steer.to())
            .await
            .unwrap()
        {
            Transition::Applied(info) => {
                assert_eq!(info.status, steer.to());
                true
            }
            Transition::Refused(info) => {
                assert_eq!(info.status, model.status, "a refusal reports the status");
                false
            }
            Transition::NotFound => panic!("task {id} vanished"),
        },
        Op::Renew { node, stale } => {
            let renewed = store
                .renew_leases(&nodes[node], vec![(id.to_owned(), lease_of(stale))])
                .await
                .unwrap();
            renewed == [id.to_owned()]
        }
        Op::Release(node) => store.release_leases(&nodes[node].node).await.unwrap() == 1,
        Op::Restart => {
            // Releases every running task of the file, other cases' too: only the effect on
            // this task is checked.
            store.release_stale_leases().await.unwrap();
            true
        }
    }
}

/// Commits `commit`; whether it applied. An applied commit answers with the task as it left it.
async fn committed(store: &Store, id: &str, views: &mut Views, commit: StepCommit) -> bool {
    let lease = commit.lease;
    let Some(info) = store.commit_step(commit).await.unwrap() else {
        return false;
    };
    let stored = store.get_task(id).await.unwrap();
    assert_eq!(
        Some(&info),
        stored.as_ref(),
        "a commit answers with the row it left"
    );
    views.insert(lease, info);
    true
}

/// The `n`th question a task asks.
fn question(n: u64) -> durable_shared::Question {
    durable_shared::Question {
        id: format!("q{n}"),
        message: format!("question {n}"),
        schema: json!({"type": "object"}),
    }
}

/// Runs `cases` random sequences against `store`, one fresh task (and two fresh node names)
/// per case.
fn check_model(runtime: &tokio::runtime::Runtime, fixture: &Fixture, cases: u32) {
    let store = &fixture.store;
    let restart_releases = matches!(fixture.database, Database::Sqlite(_));
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        // Shrunk failures are reported in the panic message; nothing is written to the tree.
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        let id = format!("model-{n}");
        let nodes = [node(&format!("a{n}")), node(&format!("b{n}"))];
        // An owner of its own, whose count of unfinished tasks is this task's status.
        let owner = format!("owner-{n}");
        runtime.block_on(async {
            store
                .insert_task(NewTask {
                    owner: owner.clone(),
                    ..new_task(&id)
                })
                .await
                .unwrap();
            let mut model = Model::new(restart_releases);
            let mut views = Views::new();
            for (i, op) in ops.iter().enumerate() {
                let applied = apply(store, &id, &nodes, &model, &mut views, op).await;
                let before = model.clone();
                let allowed = model.apply(op);
                prop_assert_eq!(
                    applied,
                    allowed,
                    "op {} {:?} on {:?}: the store and the rules disagree",
                    i,
                    op,
                    before
                );
                let task = store.get_task(&id).await.unwrap().unwrap();
                prop_assert_eq!(task.status, model.status, "after op {} {:?}", i, op);
                prop_assert_eq!(task.step, model.step, "after op {} {:?}", i, op);
                let open =
                    (model.status == TaskStatus::InputRequired).then(|| question(model.asked));
                prop_assert_eq!(task.question, open, "after op {} {:?}", i, op);
                let unfinished = store.unfinished_tasks_of(&owner).await.unwrap();
                prop_assert_eq!(
                    unfinished,
                    u64::from(!model.status.is_terminal()),
                    "the owner's unfinished tasks after op {} {:?}",
                    i,
                    op
                );
                if before.status.is_terminal() {
                    prop_assert_eq!(task.status, before.status, "a terminal status was left");
                }
            }
            Ok(())
        })
    });
    match outcome {
        Ok(()) => {}
        Err(TestError::Fail(reason, ops)) => {
            panic!("{reason}\nminimal failing sequence: {ops:#?}")
        }
        Err(e) => panic!("{e}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_sqlite_store_follows_the_lifecycle_model() {
    let runtime = runtime();
    let fixture = runtime.block_on(Fixture::sqlite());
    check_model(&runtime, &fixture, 256);
}

#[test]
fn the_postgres_store_follows_the_lifecycle_model() {
    let runtime = runtime();
    match runtime.block_on(Fixture::postgres()) {
        Some(fixture) => check_model(&runtime, &fixture, 64),
        None => eprintln!("skipped: {TEST_SERVER_VAR} names no PostgreSQL server"),
    }
}
