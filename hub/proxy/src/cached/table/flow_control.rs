//! The `flowcontrol.apiserver.k8s.io` kinds' Tables (API Priority and Fairness):
//! FlowSchemas and PriorityLevelConfigurations, ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO).

use serde_json::{Value, json};

use super::{
    Column,
    columns::{CREATED_DOC, NAME_DOC, col},
    format::{int, string},
};

/// A flow-control kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowControl {
    FlowSchema,
    PriorityLevel,
}

/// `flowSchemaColumnDefinitions`.
#[rustfmt::skip]
const FLOW_SCHEMA: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("PriorityLevel", "string", "", 0, "`name` is the name of the priority level configuration being referenced Required."),
    col("MatchingPrecedence", "string", "", 0, "`matchingPrecedence` is used to choose among the FlowSchemas that match a given request. The chosen FlowSchema is among those with the numerically lowest (which we take to be logically highest) MatchingPrecedence.  Each MatchingPrecedence value must be ranged in [1,10000]. Note that if the precedence is not specified, it will be set to 1000 as default."),
    col("DistinguisherMethod", "string", "", 0, "`distinguisherMethod` defines how to compute the flow distinguisher for requests that match this schema. `nil` specifies that the distinguisher is disabled and thus will always be the empty string."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("MissingPL", "string", "", 0, "references a broken or non-existent PriorityLevelConfiguration"),
];

/// `priorityLevelColumnDefinitions`.
#[rustfmt::skip]
const PRIORITY_LEVEL: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Type", "string", "", 0, "`type` indicates whether this priority level is subject to limitation on request execution.  A value of `\"Exempt\"` means that requests of this priority level are not subject to a limit (and thus are never queued) and do not detract from the capacity made available to other priority levels.  A value of `\"Limited\"` means that (a) requests of this priority level _are_ subject to limits and (b) some of the server's limited capacity is made available exclusively to this priority level. Required."),
    col("NominalConcurrencyShares", "string", "", 0, "`nominalConcurrencyShares` (NCS) contributes to the computation of the NominalConcurrencyLimit (NominalCL) of this level. This is the number of execution seats available at this priority level. This is used both for requests dispatched from this priority level as well as requests dispatched from other priority levels borrowing seats from this level. The server's concurrency limit (ServerCL) is divided among the Limited priority levels in proportion to their NCS values:\n\nNominalCL(i)  = ceil( ServerCL * NCS(i) / sum_ncs ) sum_ncs = sum[priority level k] NCS(k)\n\nBigger numbers mean a larger nominal concurrency limit, at the expense of every other priority level.\n\nIf not specified, this field defaults to a value of 30.\n\nSetting this field to zero supports the construction of a \"jail\" for this priority level that is used to hold some request(s)"),
    col("Queues", "string", "", 0, "`queues` is the number of queues for this priority level. The queues exist independently at each apiserver. The value must be positive.  Setting it to 1 effectively precludes shufflesharding and thus makes the distinguisher method of associated flow schemas irrelevant.  This field has a default value of 64."),
    col("HandSize", "string", "", 0, "`handSize` is a small positive number that configures the shuffle sharding of requests into queues.  When enqueuing a request at this priority level the request's flow identifier (a string pair) is hashed and the hash value is used to shuffle the list of queues and deal a hand of the size specified here.  The request is put into one of the shortest queues in that hand. `handSize` must be no larger than `queues`, and should be significantly smaller (so that a few heavy flows do not saturate most of the queues).  See the user-facing documentation for more extensive guidance on setting this field.  This field has a default value of 8."),
    col("QueueLengthLimit", "string", "", 0, "`queueLengthLimit` is the maximum number of requests allowed to be waiting in a given queue of this priority level at a time; excess requests are rejected.  This value must be positive.  If not specified, it will be defaulted to 50."),
    col("Age", "string", "", 0, CREATED_DOC),
];

impl FlowControl {
    /// The kind of a resource of `flowcontrol.apiserver.k8s.io`.
    pub fn of(resource: &str) -> Option<FlowControl> {
        match resource {
            "flowschemas" => Some(FlowControl::FlowSchema),
            "prioritylevelconfigurations" => Some(FlowControl::PriorityLevel),
            _ => None,
        }
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            FlowControl::FlowSchema => FLOW_SCHEMA,
            FlowControl::PriorityLevel => PRIORITY_LEVEL,
        }
    }

    pub fn cells(self, o: &Value, name: Value, age: Value) -> Vec<Value> {
        match self {
            FlowControl::FlowSchema => flow_schema(o, name, age),
            FlowControl::PriorityLevel => priority_level(o, name, age),
        }
    }
}

/// `printFlowSchema`: the priority level, the precedence (a number), the distinguisher
/// (`<none>` without), and the first `Dangling` condition's status (`?` without).
fn flow_schema(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let distinguisher = match o.pointer("/spec/distinguisherMethod") {
        Some(d) if !d.is_null() => string(d.get("type")),
        _ => "<none>",
    };
    let dangling = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| string(c.get("type")) == "Dangling")
        .map_or("?", |c| string(c.get("status")));
    vec![
        name,
        json!(string(o.pointer("/spec/priorityLevelConfiguration/name"))),
        json!(int(o.pointer("/spec/matchingPrecedence"))),
        json!(distinguisher),
        age,
        json!(dangling),
    ]
}

/// `printPriorityLevelConfiguration`: the type, and for a limited level its shares and
/// queuing (numbers), `<none>` where there are none.
fn priority_level(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let none = || json!("<none>");
    let (mut shares, mut queues, mut hand_size, mut queue_length) =
        (none(), none(), none(), none());
    if let Some(limited) = o.pointer("/spec/limited").filter(|l| !l.is_null()) {
        shares = json!(int(limited.get("nominalConcurrencyShares")));
        if let Some(queuing) = limited
            .pointer("/limitResponse/queuing")
            .filter(|q| !q.is_null())
        {
            queues = json!(int(queuing.get("queues")));
            hand_size = json!(int(queuing.get("handSize")));
            queue_length = json!(int(queuing.get("queueLengthLimit")));
        }
    }
    vec![
        name,
        json!(string(o.pointer("/spec/type"))),
        shares,
        queues,
        hand_size,
        queue_length,
        age,
    ]
}
