//! Workflows (chain, group, batch, and the DAG `depends_on` form) and cron registrations: the
//! validation and preparation; SQL runs the one DAG engine and the firing compare-and-set.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::cron::{Schedule, parse_time_zone};
use super::validate::{self, new_job_row};
use super::{CoreError, EnqueueJob, ErrorKind, Scope, Service};
pub use crate::model::workflow::CronEntry;

/// Most steps one workflow may have.
pub const MAX_WORKFLOW_STEPS: usize = 1000;

/// One step of a workflow to create.
#[derive(Debug, Clone, Default)]
pub struct NewStep {
    /// Step name (DAG form); defaults to its position.
    pub key: Option<String>,
    /// Names of the steps it waits for (DAG form).
    pub depends_on: Vec<String>,
    /// The job it runs.
    pub job: EnqueueJob,
}

/// The name of a workflow created without one.
pub const DEFAULT_WORKFLOW_NAME: &str = "workflow";

/// A workflow to create.
#[derive(Debug, Clone, Default)]
pub struct NewWorkflow {
    /// `chain` (each step after the previous), `group`, `batch` (group + callbacks) or `dag`;
    /// none: `dag` when a step names its id or dependencies (see `workflow_kind`).
    pub kind: Option<String>,
    /// Name; `DEFAULT_WORKFLOW_NAME` when the request gives none.
    pub name: Option<String>,
    /// Steps (chain, dag) or jobs (group, batch).
    pub steps: Vec<NewStep>,
    /// Batch callbacks by name: on_complete, on_success, on_failure.
    pub callbacks: Vec<(String, EnqueueJob)>,
}

/// A step as the workflow reports it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct WorkflowStep {
    /// Step name.
    pub id: String,
    /// Job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// waiting, enqueued, completed, failed or cancelled.
    pub state: String,
    /// The step's job.
    pub job_id: Uuid,
    /// Positions of the steps it waits for.
    pub depends_on: Vec<i64>,
}

/// A step's state in the proto's `WorkflowStepState` terms, which both protocols speak (HTTP as
/// lowercase names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepState {
    /// Waits for the steps it depends on.
    Waiting,
    /// Its job is enqueued (stored as `enqueued`).
    Pending,
    /// Its job completed.
    Completed,
    /// Its job failed for good.
    Failed,
    /// Cancelled with its workflow.
    Cancelled,
    /// A state this version does not know.
    Unspecified,
}

impl StepState {
    /// The lowercase name (`WORKFLOW_STEP_STATE_PENDING` is `pending`).
    pub fn name(self) -> &'static str {
        match self {
            StepState::Waiting => "waiting",
            StepState::Pending => "pending",
            StepState::Completed => "completed",
            StepState::Failed => "failed",
            StepState::Cancelled => "cancelled",
            StepState::Unspecified => "unspecified",
        }
    }
}

impl WorkflowStep {
    /// The step's state in the proto's terms.
    pub fn step_state(&self) -> StepState {
        match self.state.as_str() {
            "waiting" => StepState::Waiting,
            "enqueued" => StepState::Pending,
            "completed" => StepState::Completed,
            "failed" => StepState::Failed,
            "cancelled" => StepState::Cancelled,
            _ => StepState::Unspecified,
        }
    }
}

impl Workflow {
    /// The ids of the steps `step` waits for (stored as positions).
    pub fn depends_on_ids(&self, step: &WorkflowStep) -> Vec<String> {
        step.depends_on
            .iter()
            .filter_map(|d| usize::try_from(*d).ok())
            .filter_map(|d| self.steps.get(d).map(|p| p.id.clone()))
            .collect()
    }
}

/// A workflow and its progress.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Workflow {
    /// Id (UUIDv7).
    pub id: Uuid,
    /// Name.
    pub name: String,
    /// chain, group, batch or dag.
    #[serde(rename = "type")]
    pub kind: String,
    /// running, completed, failed or cancelled.
    pub state: String,
    /// When created.
    pub created_at: DateTime<Utc>,
    /// When it ended.
    pub completed_at: Option<DateTime<Utc>>,
    /// When cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// Steps in all.
    pub steps_total: i64,
    /// Steps completed.
    pub steps_completed: i64,
    /// The steps.
    pub steps: Vec<WorkflowStep>,
    /// On cancel: steps cancelled.
    #[serde(default)]
    pub steps_cancelled: Option<i64>,
    /// On cancel: steps that had completed.
    #[serde(default)]
    pub steps_already_completed: Option<i64>,
}

/// A cron registration to create.
#[derive(Debug, Clone, Default)]
pub struct NewCron {
    /// Unique name.
    pub name: String,
    /// Five-field expression or shorthand.
    pub expression: String,
    /// IANA time zone (UTC by default).
    pub timezone: Option<String>,
    /// allow, skip (default) or cancel.
    pub overlap_policy: Option<String>,
    /// The job each firing enqueues.
    pub template: EnqueueJob,
}

impl NewWorkflow {
    /// The queues its jobs land in (steps and callbacks): both adapters admit them all.
    pub fn queues(&self) -> impl Iterator<Item = &str> {
        self.steps
            .iter()
            .map(|s| s.job.queue())
            .chain(self.callbacks.iter().map(|(_, job)| job.queue()))
    }
}

impl NewCron {
    /// The queue its firings enqueue into: both adapters admit it.
    pub fn queue(&self) -> &str {
        self.template.queue()
    }
}

fn check_step_name(name: &str) -> Result<(), CoreError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(CoreError::invalid(format!(
            "name {name:?} is invalid: use 1-255 letters, digits, '.', '-', '_' or ':'"
        )))
    }
}

/// The workflow's type: the one it names, else `dag` when its steps name ids or dependencies.
fn workflow_kind(workflow: &NewWorkflow) -> Result<&str, CoreError> {
    match &workflow.kind {
        Some(kind) => Ok(kind),
        None if workflow
            .steps
            .iter()
            .any(|s| s.key.is_some() || !s.depends_on.is_empty()) =>
        {
            Ok("dag")
        }
        None => Err(CoreError::invalid(
            "type is required: chain, group or batch",
        )),
    }
}

/// Dependency positions per step; refuses unknown names and cycles.
fn dependencies(workflow: &NewWorkflow) -> Result<Vec<Vec<usize>>, CoreError> {
    let n = workflow.steps.len();
    match workflow_kind(workflow)? {
        "chain" => {
            return Ok((0..n)
                .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
                .collect());
        }
        "group" | "batch" => return Ok(vec![Vec::new(); n]),
        "dag" => {}
        other => {
            return Err(CoreError::invalid(format!(
                "workflow type {other:?} must be chain, group or batch (or steps with depends_on)"
            )));
        }
    }
    let mut index = HashMap::new();
    for (i, step) in workflow.steps.iter().enumerate() {
        let key = step.key.clone().unwrap_or_else(|| i.to_string());
        if index.insert(key.clone(), i).is_some() {
            return Err(CoreError::invalid(format!("step id {key:?} is used twice")));
        }
    }
    let deps = workflow
        .steps
        .iter()
        .map(|s| {
            s.depends_on
                .iter()
                .map(|d| {
                    index.get(d).copied().ok_or_else(|| {
                        CoreError::invalid(format!("depends_on names an unknown step {d:?}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Kahn's algorithm: every step must become runnable eventually.
    let mut remaining: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&i| remaining[i] == 0).collect();
    let mut seen = 0;
    while let Some(i) = ready.pop() {
        seen += 1;
        for (j, d) in deps.iter().enumerate() {
            for &k in d {
                if k == i {
                    remaining[j] -= 1;
                    if remaining[j] == 0 {
                        ready.push(j);
                    }
                }
            }
        }
    }
    if seen != n {
        return Err(CoreError::invalid("the steps' depends_on form a cycle"));
    }
    Ok(deps)
}

/// A step's job validated and in the JSON `s3p.workflow_create` stores for it.
fn prepared(job: &EnqueueJob, now: DateTime<Utc>, what: &str) -> Result<Value, CoreError> {
    refuse_nesting(job).map_err(|e| validate::within(what, e))?;
    refuse_unique(job).map_err(|e| validate::within(what, e))?;
    let row = new_job_row(job, now).map_err(|e| validate::within(what, e))?;
    serde_json::to_value(row)
        .map_err(|e| CoreError::invalid(format!("{what}: {e}")).with_detail("field", what.into()))
}

/// The workflow primitives a step's `type` may not name: an SDK nesting a group or chain in a
/// workflow sends it as a step of that type, which would otherwise be stored as a job of type
/// `group` whose own jobs never exist. Nested workflows are not supported: refused, not stored
/// wrong.
const PRIMITIVES: [&str; 3] = ["chain", "group", "batch"];

fn refuse_nesting(job: &EnqueueJob) -> Result<(), CoreError> {
    // A job step carrying steps or jobs of its own is the same nesting in another spelling:
    // storing the job alone would drop them.
    if let Some(key) = ["steps", "jobs"]
        .into_iter()
        .find(|k| job.extra.contains_key(*k))
    {
        return Err(CoreError::invalid(format!(
            "a step with {key:?} of its own is a nested workflow, which pgvs3 does not support: \
             give every step a job type, or express the shape with depends_on"
        ))
        .with_detail("field", key.into()));
    }
    if PRIMITIVES.contains(&job.job_type.as_str()) {
        return Err(CoreError::invalid(format!(
            "a step of type {:?} is a nested workflow, which pgvs3 does not support: \
             give every step a job type, or express the shape with depends_on",
            job.job_type
        ))
        .with_detail("field", "type".into()));
    }
    Ok(())
}

/// A step's job is enqueued when its dependencies complete, inside the worker's ack: a unique
/// conflict there would leave the step waiting for a job that is never stored (ignore) or refuse
/// the worker's ack (reject). Refused when the workflow is made, not stored to stall.
fn refuse_unique(job: &EnqueueJob) -> Result<(), CoreError> {
    match job.options.unique {
        Some(ref unique) if !unique.is_null() => Err(CoreError::invalid(
            "a workflow step or callback cannot carry a unique policy: its job is enqueued \
             inside the ack of the step before it, where a duplicate would stall the workflow",
        )
        .with_detail("field", "options.unique".into())),
        _ => Ok(()),
    }
}

impl Service {
    /// Creates a workflow and enqueues the steps that can run at once.
    pub async fn create_workflow(&self, workflow: NewWorkflow) -> Result<Workflow, CoreError> {
        let name = workflow.name.as_deref().unwrap_or(DEFAULT_WORKFLOW_NAME);
        check_step_name(name)?;
        let kind = workflow_kind(&workflow)?;
        if workflow.steps.is_empty() || workflow.steps.len() > MAX_WORKFLOW_STEPS {
            return Err(CoreError::invalid(format!(
                "a workflow needs between 1 and {MAX_WORKFLOW_STEPS} steps"
            )));
        }
        let deps = dependencies(&workflow)?;
        let now = Utc::now();
        let mut steps = Vec::with_capacity(workflow.steps.len());
        for (i, (step, deps)) in workflow.steps.iter().zip(deps).enumerate() {
            steps.push(json!({
                "key": step.key.clone().unwrap_or_else(|| i.to_string()),
                "depends_on": deps,
                "job": prepared(&step.job, now, &format!("steps[{i}]"))?,
            }));
        }
        if !workflow.callbacks.is_empty() && kind != "batch" {
            return Err(CoreError::invalid("callbacks belong to batch workflows"));
        }
        let mut callbacks = Map::new();
        for (name, job) in &workflow.callbacks {
            if !matches!(name.as_str(), "on_complete" | "on_success" | "on_failure") {
                return Err(CoreError::invalid(format!(
                    "callback {name:?} must be on_complete, on_success or on_failure"
                )));
            }
            callbacks.insert(
                name.clone(),
                prepared(job, now, &format!("callbacks.{name}"))?,
            );
        }
        let view = self
            .store
            .create_workflow(
                Uuid::now_v7(),
                name,
                kind,
                &Value::Array(steps),
                &Value::Object(callbacks),
            )
            .await?;
        workflow_from(view)
    }

    /// `not_found` unless every queue of workflow `id` is in `scope` (free for every-queue
    /// scopes): a workflow of other queues answers as one that does not exist.
    async fn workflow_in_scope(&self, scope: &Scope, id: Uuid) -> Result<(), CoreError> {
        if scope.is_all() || self.store.workflow_in_scope(scope, id).await? {
            Ok(())
        } else {
            // The very answer the store gives for a workflow that does not exist (PV404, no
            // details): another queue's workflow must not read differently.
            Err(CoreError::new(
                ErrorKind::NotFound,
                format!("workflow {id} not found"),
            ))
        }
    }

    /// A workflow's progress.
    pub async fn get_workflow(&self, scope: &Scope, id: &str) -> Result<Workflow, CoreError> {
        let id = parse_workflow_id(id)?;
        self.workflow_in_scope(scope, id).await?;
        workflow_from(self.store.workflow(id).await?)
    }

    /// Cancels a running workflow.
    pub async fn cancel_workflow(&self, scope: &Scope, id: &str) -> Result<Workflow, CoreError> {
        let id = parse_workflow_id(id)?;
        self.workflow_in_scope(scope, id).await?;
        workflow_from(self.store.cancel_workflow(id).await?)
    }

    /// Registers a cron job; 409 duplicate when the name exists.
    pub async fn register_cron(&self, cron: NewCron) -> Result<CronEntry, CoreError> {
        check_step_name(&cron.name)?;
        let schedule = Schedule::parse(&cron.expression).map_err(|e| {
            CoreError::invalid(e.to_string()).with_detail("field", "expression".into())
        })?;
        let timezone = cron.timezone.clone().unwrap_or_else(|| "UTC".to_string());
        let tz = parse_time_zone(&timezone).map_err(|e| {
            CoreError::invalid(e.to_string()).with_detail("field", "timezone".into())
        })?;
        let overlap = cron
            .overlap_policy
            .clone()
            .unwrap_or_else(|| "skip".to_string());
        if !matches!(overlap.as_str(), "allow" | "skip" | "cancel") {
            return Err(CoreError::invalid(format!(
                "overlap_policy {overlap:?} must be allow, skip or cancel"
            )));
        }
        let now = Utc::now();
        prepared(&cron.template, now, "job_template")?;
        let first = schedule.next_after(now, tz);
        let template = serde_json::to_value(&cron.template)
            .map_err(|e| CoreError::invalid(format!("job_template cannot be stored: {e}")))?;
        self.store
            .register_cron(
                &cron.name,
                &cron.expression,
                &timezone,
                &overlap,
                &template,
                first,
            )
            .await
    }

    /// Removes a cron job; one of a queue outside `scope` answers as one that does not exist.
    pub async fn unregister_cron(&self, scope: &Scope, name: &str) -> Result<CronEntry, CoreError> {
        check_step_name(name)?;
        self.store.unregister_cron(scope, name).await
    }

    /// A page of the cron registrations of queues in `scope`, in name order.
    pub async fn list_crons(
        &self,
        scope: &Scope,
        page: &super::page::PageRequest,
    ) -> Result<super::page::Page<CronEntry>, CoreError> {
        let spec = page.check()?;
        let mut items = self
            .store
            .list_crons(scope, spec.after.as_deref(), spec.limit + 1)
            .await?;
        let total = self.store.count_crons(scope).await?;
        Ok(spec.finish(&mut items, total, |c| c.name.as_str()))
    }

    /// Fires every due cron slot (each exactly once across gateways); returns how many jobs it
    /// enqueued.
    pub async fn fire_due_crons(&self) -> Result<usize, CoreError> {
        // Maintenance mode: due slots wait, and fire once it ends.
        if self.admin_state().in_maintenance() {
            return Ok(0);
        }
        let now = Utc::now();
        let mut fired = 0;
        for entry in self.store.due_crons(100).await? {
            let (Some(expected), Ok(schedule), Ok(tz)) = (
                entry.next_run_at,
                Schedule::parse(&entry.expression),
                parse_time_zone(&entry.timezone),
            ) else {
                continue;
            };
            let following = schedule.next_after(now, tz);
            let template: EnqueueJob = match serde_json::from_value(entry.job_template.clone()) {
                Ok(t) => t,
                Err(error) => {
                    tracing::warn!(cron = %entry.name, %error, "cron template is unreadable");
                    continue;
                }
            };
            let row = match new_job_row(&template, now) {
                Ok(row) => row,
                Err(error) => {
                    tracing::warn!(cron = %entry.name, %error, "cron template no longer validates");
                    continue;
                }
            };
            // One entry the database refuses must not hold back the others due after it.
            match self
                .store
                .fire_cron(&entry.name, expected, following, &row)
                .await
            {
                Ok(Some(_)) => fired += 1,
                Ok(None) => {}
                Err(error) => tracing::warn!(cron = %entry.name, %error, "cron firing failed"),
            }
        }
        Ok(fired)
    }
}

fn parse_workflow_id(id: &str) -> Result<Uuid, CoreError> {
    Uuid::try_parse(id).map_err(|_| {
        CoreError::invalid(format!("workflow id {id:?} is not a UUID"))
            .with_detail("field", "workflow_id".into())
    })
}

fn workflow_from(view: Value) -> Result<Workflow, CoreError> {
    serde_json::from_value(view).map_err(|e| {
        CoreError::new(
            super::ErrorKind::Backend,
            format!("workflow view could not be read: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(key: &str, deps: &[&str]) -> NewStep {
        NewStep {
            key: Some(key.to_string()),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            job: EnqueueJob::default(),
        }
    }

    #[test]
    fn dag_dependencies_resolve_and_cycles_are_refused() {
        let ok = NewWorkflow {
            kind: Some("dag".into()),
            steps: vec![step("a", &[]), step("b", &["a"]), step("c", &["a", "b"])],
            ..Default::default()
        };
        assert_eq!(
            dependencies(&ok).expect("acyclic"),
            vec![vec![], vec![0], vec![0, 1]]
        );
        let cycle = NewWorkflow {
            kind: Some("dag".into()),
            steps: vec![step("a", &["b"]), step("b", &["a"])],
            ..Default::default()
        };
        assert!(dependencies(&cycle).is_err());
        let unknown = NewWorkflow {
            kind: Some("dag".into()),
            steps: vec![step("a", &["zzz"])],
            ..Default::default()
        };
        assert!(dependencies(&unknown).is_err());
        let chain = NewWorkflow {
            kind: Some("chain".into()),
            steps: vec![step("a", &[]), step("b", &[])],
            ..Default::default()
        };
        assert_eq!(dependencies(&chain).expect("chain"), vec![vec![], vec![0]]);
    }

    #[test]
    fn without_a_type_named_steps_make_a_dag_and_plain_steps_are_refused() {
        let named = NewWorkflow {
            steps: vec![step("a", &[]), step("b", &["a"])],
            ..Default::default()
        };
        assert_eq!(workflow_kind(&named).expect("dag"), "dag");
        let plain = NewWorkflow {
            steps: vec![NewStep::default()],
            ..Default::default()
        };
        let refused = workflow_kind(&plain).expect_err("no type");
        assert!(
            refused.message.contains("type is required"),
            "{}",
            refused.message
        );
        let given = NewWorkflow {
            kind: Some("group".into()),
            steps: vec![step("a", &[])],
            ..Default::default()
        };
        assert_eq!(workflow_kind(&given).expect("group"), "group");
    }
}
