//! The graph IR: values, nodes in topological order, initializers.

use std::collections::HashMap;

use oxgen_onnx::proto::{self, tensor_shape_proto::dimension, type_proto};
use oxgen_tensor::{DType, Tensor};

use crate::registry::normalize_domain;
use crate::{GraphError, NodeRef, Op, Registry};

/// Index of a value (a named tensor) in [`Graph::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub usize);

pub use oxgen_tensor::Dim;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Input,
    Initializer,
    Node,
    /// In a subgraph (a branch or loop body): a value of an enclosing graph it reads, listed
    /// in [`Graph::captures`].
    Captured,
}

/// A named value and what the model declares about it.
#[derive(Debug, Clone)]
pub struct ValueInfo {
    pub name: String,
    pub kind: ValueKind,
    /// Declared element type (graph inputs/outputs, value_info), when known.
    pub dtype: Option<DType>,
    /// Declared shape, when the model states one.
    pub dims: Option<Vec<Dim>>,
}

/// One node with its typed op.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
    pub op: Op,
    /// `None` for an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    /// `None` for an output the model does not use.
    pub outputs: Vec<Option<ValueId>>,
}

impl Node {
    pub fn node_ref(&self) -> NodeRef {
        NodeRef {
            name: self.name.clone(),
            op_type: self.op_type.clone(),
            domain: self.domain.clone(),
            opset: self.opset,
        }
    }
}

/// A loaded graph: nodes sorted so every input is produced before use.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub values: Vec<ValueInfo>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub initializers: HashMap<ValueId, Tensor>,
    pub nodes: Vec<Node>,
    /// A subgraph's values from enclosing graphs (empty for a model's main graph). The node
    /// that owns the subgraph lists them among its inputs, after its declared ones, so the
    /// enclosing graph orders and frees them like any input (see [`crate::ops::Subgraph`]).
    pub captures: Vec<ValueId>,
}

/// The names an enclosing graph defines, visible to the subgraphs of its nodes.
pub(crate) struct Scope<'s> {
    names: &'s HashMap<String, ValueId>,
    parent: Option<&'s Scope<'s>>,
}

impl Scope<'_> {
    fn sees(&self, name: &str) -> bool {
        self.names.contains_key(name) || self.parent.is_some_and(|p| p.sees(name))
    }
}

/// Values and their names while a graph is built.
#[derive(Default)]
struct Values {
    values: Vec<ValueInfo>,
    by_name: HashMap<String, ValueId>,
    captures: Vec<ValueId>,
}

impl Values {
    fn add(&mut self, name: &str, kind: ValueKind) -> ValueId {
        let id = ValueId(self.values.len());
        self.values.push(ValueInfo {
            name: name.to_string(),
            kind,
            dtype: None,
            dims: None,
        });
        self.by_name.insert(name.to_string(), id);
        if kind == ValueKind::Captured {
            self.captures.push(id);
        }
        id
    }

    /// The value `name` names here, captured from an enclosing graph when only it defines it.
    fn resolve(&mut self, name: &str, outer: Option<&Scope>) -> Option<ValueId> {
        match self.by_name.get(name) {
            Some(&id) => Some(id),
            None if outer.is_some_and(|o| o.sees(name)) => {
                Some(self.add(name, ValueKind::Captured))
            }
            None => None,
        }
    }
}

fn declared(info: &proto::ValueInfoProto) -> (Option<DType>, Option<Vec<Dim>>) {
    let Some(type_proto::Value::TensorType(t)) =
        info.r#type.as_ref().and_then(|t| t.value.as_ref())
    else {
        return (None, None);
    };
    let dtype = t.elem_type.and_then(DType::from_onnx);
    let dims = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::Fixed(*v as usize),
                Some(dimension::Value::DimParam(p)) => Dim::Symbolic(p.clone()),
                _ => Dim::Unknown,
            })
            .collect()
    });
    (dtype, dims)
}

impl Graph {
    /// Builds the IR of `model`'s main graph with the default registry.
    pub fn from_model(model: &oxgen_onnx::Model) -> Result<Graph, GraphError> {
        Self::from_model_with(model, &Registry::default())
    }

    pub fn from_model_with(
        model: &oxgen_onnx::Model,
        registry: &Registry,
    ) -> Result<Graph, GraphError> {
        build(model, model.graph(), registry, None)
    }

    pub fn value(&self, id: ValueId) -> &ValueInfo {
        &self.values[id.0]
    }

    /// Looks a value up by name.
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name).map(ValueId)
    }
}

/// Builds graph `g` of `model` (its main graph, or with `outer` a subgraph of a node of an
/// enclosing graph, whose names it may read).
pub(crate) fn build(
    model: &oxgen_onnx::Model,
    g: &proto::GraphProto,
    registry: &Registry,
    outer: Option<&Scope>,
) -> Result<Graph, GraphError> {
    let mut v = Values::default();
    let mut producer: HashMap<ValueId, String> = HashMap::new();

    let mut initializers = HashMap::new();
    for init in &g.initializer {
        let name = init.name();
        if v.by_name.contains_key(name) {
            return Err(GraphError::DuplicateValue {
                value: name.into(),
                first: "an initializer".into(),
                second: "another initializer".into(),
            });
        }
        let id = v.add(name, ValueKind::Initializer);
        let tensor = model.tensor(init)?;
        v.values[id.0].dtype = Some(tensor.dtype());
        v.values[id.0].dims = Some(tensor.dims().iter().map(|&d| Dim::Fixed(d)).collect());
        initializers.insert(id, tensor);
    }
    let mut inputs = Vec::new();
    for input in &g.input {
        // Older models list initializers among the inputs too; those stay initializers.
        if v.by_name.contains_key(input.name()) {
            continue;
        }
        let id = v.add(input.name(), ValueKind::Input);
        let (dtype, dims) = declared(input);
        // A subgraph's inputs may leave their type to inference (a loop body's often do).
        let untyped_in_subgraph = outer.is_some() && input.r#type.is_none();
        if dtype.is_none() && !untyped_in_subgraph {
            return Err(GraphError::Io { what: "input", name: input.name().into(), reason: "has no tensor type oxgen supports (only dense tensors of the numeric and bool types)".into() });
        }
        v.values[id.0].dtype = dtype;
        v.values[id.0].dims = dims;
        inputs.push(id);
    }

    // Nodes: register every output first so order in the file does not matter.
    let mut node_outs: Vec<Vec<Option<ValueId>>> = Vec::with_capacity(g.node.len());
    for node in &g.node {
        let mut outs = Vec::new();
        for out in &node.output {
            if out.is_empty() {
                outs.push(None);
                continue;
            }
            if let Some(id) = v.by_name.get(out) {
                let first = producer
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| "a graph input or initializer".into());
                return Err(GraphError::DuplicateValue {
                    value: out.clone(),
                    first,
                    second: format!("node '{}'", node.name()),
                });
            }
            let id = v.add(out, ValueKind::Node);
            producer.insert(id, format!("node '{}'", node.name()));
            outs.push(Some(id));
        }
        node_outs.push(outs);
    }

    let node_ref_of = |node: &proto::NodeProto| {
        let domain = normalize_domain(node.domain());
        let opset = model
            .opset(domain)
            .unwrap_or(if domain.is_empty() { 1 } else { 0 });
        NodeRef {
            name: node.name().into(),
            op_type: node.op_type().into(),
            domain: domain.into(),
            opset,
        }
    };
    let mut node_ins: Vec<Vec<Option<ValueId>>> = Vec::with_capacity(g.node.len());
    for node in &g.node {
        let mut ins = Vec::with_capacity(node.input.len());
        for input in &node.input {
            if input.is_empty() {
                ins.push(None);
                continue;
            }
            match v.resolve(input, outer) {
                Some(id) => ins.push(Some(id)),
                None => {
                    return Err(GraphError::UndefinedValue {
                        node: Box::new(node_ref_of(node)),
                        value: input.clone(),
                    });
                }
            }
        }
        node_ins.push(ins);
    }

    // The ops; a node's subgraphs may read any name defined here or further out.
    let mut ops = Vec::with_capacity(g.node.len());
    {
        let scope = Scope {
            names: &v.by_name,
            parent: outer,
        };
        for node in &g.node {
            let node_ref = node_ref_of(node);
            let opset = node_ref.opset;
            ops.push(registry.build(node, opset, model, g, &scope)?);
        }
    }

    let mut nodes = Vec::with_capacity(g.node.len());
    for ((node, mut op), (mut ins, outputs)) in g
        .node
        .iter()
        .zip(ops)
        .zip(node_ins.into_iter().zip(node_outs))
    {
        let node_ref = node_ref_of(node);
        // What the node's subgraphs capture becomes its inputs after the declared ones.
        for sub in op.subgraphs_mut() {
            sub.inputs.clear();
            for &c in &sub.graph.captures {
                let name = &sub.graph.values[c.0].name;
                let Some(id) = v.resolve(name, outer) else {
                    return Err(GraphError::UndefinedValue {
                        node: Box::new(node_ref.clone()),
                        value: name.clone(),
                    });
                };
                let at = match ins
                    .iter()
                    .skip(node.input.len())
                    .position(|i| *i == Some(id))
                {
                    Some(k) => node.input.len() + k,
                    None => {
                        ins.push(Some(id));
                        ins.len() - 1
                    }
                };
                sub.inputs.push(at);
            }
        }
        nodes.push(Node {
            name: node_ref.name,
            op_type: node_ref.op_type,
            domain: node_ref.domain,
            opset: node_ref.opset,
            op,
            inputs: ins,
            outputs,
        });
    }

    let mut outputs = Vec::new();
    for output in &g.output {
        let Some(id) = v.resolve(output.name(), outer) else {
            return Err(GraphError::UndefinedOutput(output.name().into()));
        };
        let (dtype, dims) = declared(output);
        let value = &mut v.values[id.0];
        value.dtype = value.dtype.or(dtype);
        if value.dims.is_none() {
            value.dims = dims;
        }
        outputs.push(id);
    }
    for info in &g.value_info {
        if let Some(&id) = v.by_name.get(info.name()) {
            let (dtype, dims) = declared(info);
            let value = &mut v.values[id.0];
            value.dtype = value.dtype.or(dtype);
            if value.dims.is_none() {
                value.dims = dims;
            }
        }
    }

    let nodes = topo_sort(nodes, v.values.len())?;
    Ok(Graph {
        values: v.values,
        inputs,
        outputs,
        initializers,
        nodes,
        captures: v.captures,
    })
}

/// Kahn's algorithm, stable with respect to the file order.
fn topo_sort(nodes: Vec<Node>, n_values: usize) -> Result<Vec<Node>, GraphError> {
    let mut produced_by: Vec<Option<usize>> = vec![None; n_values];
    for (i, node) in nodes.iter().enumerate() {
        for out in node.outputs.iter().flatten() {
            produced_by[out.0] = Some(i);
        }
    }
    let mut pending: Vec<usize> = nodes
        .iter()
        .map(|n| {
            n.inputs
                .iter()
                .flatten()
                .filter(|v| produced_by[v.0].is_some())
                .count()
        })
        .collect();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for v in node.inputs.iter().flatten() {
            if let Some(p) = produced_by[v.0] {
                consumers[p].push(i);
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &c in &consumers[i] {
            pending[c] -= 1;
            if pending[c] == 0 {
                ready.insert(c);
            }
        }
    }
    if order.len() != nodes.len() {
        let stuck = (0..nodes.len())
            .find(|i| pending[*i] > 0)
            .expect("some node is left when the sort stops early");
        return Err(GraphError::Cycle(Box::new(nodes[stuck].node_ref())));
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().expect("each node is emitted once"))
        .collect())
}
