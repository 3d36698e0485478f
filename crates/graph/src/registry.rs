//! The operator registry: `(domain, op_type, opset range)` → a builder of typed [`Op`]s.
//!
//! A builder reads the node's attributes and input/output arity through a [`NodeCtx`], which
//! records every attribute it was asked for; an attribute nobody asked for is rejected after
//! the build, so a new attribute in a future opset can never be silently ignored.

use std::collections::{BTreeSet, HashMap};

use oxgen_onnx::proto::{AttributeProto, GraphProto, NodeProto, attribute_proto::AttributeType};
use oxgen_tensor::Tensor;

use crate::ir::Scope;
use crate::{Graph, GraphError, NodeRef, Op};

/// Builds a typed op from a node.
pub type Builder = fn(&mut NodeCtx) -> Result<Op, GraphError>;

/// One registry entry: the op `op_type` in `domain` for opsets `since..=until`.
#[derive(Clone, Copy)]
pub struct OpSpec {
    pub domain: &'static str,
    pub op_type: &'static str,
    pub since: i64,
    pub until: i64,
    pub build: Builder,
}

impl OpSpec {
    /// An op valid from opset `since` on.
    pub const fn new(
        domain: &'static str,
        op_type: &'static str,
        since: i64,
        build: Builder,
    ) -> Self {
        OpSpec {
            domain,
            op_type,
            since,
            until: i64::MAX,
            build,
        }
    }

    /// The same entry limited to opsets up to `until` (inclusive).
    pub const fn until(mut self, until: i64) -> Self {
        self.until = until;
        self
    }
}

/// All ops the native backend can build.
pub struct Registry {
    specs: HashMap<(&'static str, &'static str), Vec<OpSpec>>,
}

/// The default (`ai.onnx`) domain is written `""` in the registry and in [`NodeRef`].
pub fn normalize_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

impl Default for Registry {
    fn default() -> Self {
        let mut registry = Registry {
            specs: HashMap::new(),
        };
        for spec in crate::ops::specs() {
            registry.add(spec);
        }
        registry
    }
}

impl Registry {
    pub fn add(&mut self, spec: OpSpec) {
        self.specs
            .entry((spec.domain, spec.op_type))
            .or_default()
            .push(spec);
    }

    /// Whether any opset of `(domain, op_type)` is registered.
    pub fn knows(&self, domain: &str, op_type: &str) -> bool {
        self.specs
            .contains_key(&(normalize_domain(domain), op_type))
    }

    /// The op types of `graph` that nothing is registered for, as `domain::op_type`
    /// (`ai.onnx` for the default domain), sorted, each once.
    /// Subgraphs (branches, loop bodies) count too.
    pub fn unknown_ops(&self, graph: &GraphProto) -> Vec<String> {
        fn walk(registry: &Registry, graph: &GraphProto, missing: &mut BTreeSet<String>) {
            for n in &graph.node {
                if !registry.knows(n.domain(), n.op_type()) {
                    let domain = if n.domain().is_empty() {
                        "ai.onnx"
                    } else {
                        n.domain()
                    };
                    missing.insert(format!("{domain}::{}", n.op_type()));
                }
                for a in &n.attribute {
                    for g in a.g.iter().chain(&a.graphs) {
                        walk(registry, g, missing);
                    }
                }
            }
        }
        let mut missing = BTreeSet::new();
        walk(self, graph, &mut missing);
        missing.into_iter().collect()
    }

    /// Every registered `(domain, op_type)`, sorted.
    pub fn op_types(&self) -> BTreeSet<(&'static str, &'static str)> {
        self.specs.keys().copied().collect()
    }

    /// Builds the typed op for `node` of `graph` at `opset` (the model's opset for the node's
    /// domain); its subgraphs may read the names `scope` defines.
    pub(crate) fn build(
        &self,
        node: &NodeProto,
        opset: i64,
        model: &oxgen_onnx::Model,
        graph: &GraphProto,
        scope: &Scope,
    ) -> Result<Op, GraphError> {
        let domain = normalize_domain(node.domain());
        let node_ref = NodeRef {
            name: node.name().to_string(),
            op_type: node.op_type().to_string(),
            domain: domain.to_string(),
            opset,
        };
        let Some(specs) = self.specs.get(&(domain, node.op_type())) else {
            return Err(GraphError::UnsupportedOp {
                node: Box::new(node_ref),
            });
        };
        let Some(spec) = specs.iter().find(|s| (s.since..=s.until).contains(&opset)) else {
            let supported = specs
                .iter()
                .map(|s| {
                    if s.until == i64::MAX {
                        format!("{}+", s.since)
                    } else {
                        format!("{}..={}", s.since, s.until)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(GraphError::UnsupportedOpset {
                node: Box::new(node_ref),
                supported,
            });
        };
        let mut ctx = NodeCtx {
            node,
            node_ref,
            model,
            graph,
            registry: self,
            scope,
            used: BTreeSet::new(),
        };
        let op = (spec.build)(&mut ctx)?;
        ctx.finish()?;
        Ok(op)
    }
}

/// A node being built: attribute getters that validate and record what was read.
pub struct NodeCtx<'a> {
    node: &'a NodeProto,
    node_ref: NodeRef,
    model: &'a oxgen_onnx::Model,
    /// The graph the node is in.
    graph: &'a GraphProto,
    registry: &'a Registry,
    scope: &'a Scope<'a>,
    used: BTreeSet<String>,
}

impl<'a> NodeCtx<'a> {
    pub fn node_ref(&self) -> &NodeRef {
        &self.node_ref
    }

    pub fn opset(&self) -> i64 {
        self.node_ref.opset
    }

    /// An error about attribute `attr` of this node.
    pub fn attr_error(&self, attr: &str, reason: impl Into<String>) -> GraphError {
        GraphError::Attribute {
            node: Box::new(self.node_ref.clone()),
            attr: attr.to_string(),
            reason: reason.into(),
        }
    }

    /// An error about this node.
    pub fn invalid(&self, reason: impl Into<String>) -> GraphError {
        GraphError::Invalid {
            node: Box::new(self.node_ref.clone()),
            reason: reason.into(),
        }
    }

    /// Checks the input count is within `min..=max` (trailing empty names count as absent) and
    /// that the first `min` inputs are not empty.
    pub fn inputs(&self, min: usize, max: usize) -> Result<(), GraphError> {
        let names = &self.node.input;
        let got = names
            .iter()
            .rposition(|n| !n.is_empty())
            .map_or(0, |i| i + 1);
        if got < min || got > max {
            let extra = if got > max {
                format!(
                    "; optional input {} ('{}') is not supported by this implementation",
                    max, names[max]
                )
            } else {
                String::new()
            };
            return Err(GraphError::InputCount {
                node: Box::new(self.node_ref.clone()),
                min,
                max,
                got,
                extra,
            });
        }
        if let Some(index) = names.iter().take(min).position(|n| n.is_empty()) {
            return Err(GraphError::MissingInput {
                node: Box::new(self.node_ref.clone()),
                index,
            });
        }
        Ok(())
    }

    /// Checks at most `max` outputs are requested.
    pub fn outputs(&self, max: usize) -> Result<(), GraphError> {
        let got = self
            .node
            .output
            .iter()
            .rposition(|n| !n.is_empty())
            .map_or(0, |i| i + 1);
        if got > max {
            return Err(GraphError::OutputCount {
                node: Box::new(self.node_ref.clone()),
                max,
                got,
            });
        }
        Ok(())
    }

    /// Number of outputs named (including empty names in the middle).
    pub fn output_count(&self) -> usize {
        self.node.output.len()
    }

    /// Number of inputs named (including empty names for absent optional ones).
    pub fn input_count(&self) -> usize {
        self.node.input.len()
    }

    /// Whether input `index` is present (named and non-empty).
    pub fn has_input(&self, index: usize) -> bool {
        self.node.input.get(index).is_some_and(|n| !n.is_empty())
    }

    /// The rank of input `index` when it is an initializer (weights, tables), so builders can
    /// validate axes at load; `None` when it is computed or absent.
    pub fn input_rank(&self, index: usize) -> Option<usize> {
        let name = self.node.input.get(index).filter(|n| !n.is_empty())?;
        self.graph
            .initializer
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.dims.len())
    }

    fn attr(
        &mut self,
        name: &str,
        ty: AttributeType,
    ) -> Result<Option<&'a AttributeProto>, GraphError> {
        let Some(attr) = self.node.attribute.iter().find(|a| a.name() == name) else {
            return Ok(None);
        };
        self.used.insert(name.to_string());
        if attr.ref_attr_name.is_some() {
            return Err(self.attr_error(
                name,
                "attribute references (ref_attr_name) are only valid inside functions",
            ));
        }
        if attr.r#type() != ty && attr.r#type() != AttributeType::Undefined {
            return Err(self.attr_error(
                name,
                format!(
                    "expected type {}, found {}",
                    ty.as_str_name(),
                    attr.r#type().as_str_name()
                ),
            ));
        }
        Ok(Some(attr))
    }

    /// Whether the node sets attribute `name` (does not mark it used).
    pub fn has_attr(&self, name: &str) -> bool {
        self.node.attribute.iter().any(|a| a.name() == name)
    }

    pub fn int_opt(&mut self, name: &str) -> Result<Option<i64>, GraphError> {
        Ok(self.attr(name, AttributeType::Int)?.map(|a| a.i()))
    }

    pub fn int(&mut self, name: &str, default: i64) -> Result<i64, GraphError> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    /// An int attribute that must be 0 or 1.
    pub fn bool(&mut self, name: &str, default: bool) -> Result<bool, GraphError> {
        match self.int(name, default as i64)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.attr_error(name, format!("must be 0 or 1, got {v}"))),
        }
    }

    pub fn float_opt(&mut self, name: &str) -> Result<Option<f32>, GraphError> {
        Ok(self.attr(name, AttributeType::Float)?.map(|a| a.f()))
    }

    pub fn float(&mut self, name: &str, default: f32) -> Result<f32, GraphError> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    pub fn floats_opt(&mut self, name: &str) -> Result<Option<Vec<f32>>, GraphError> {
        Ok(self
            .attr(name, AttributeType::Floats)?
            .map(|a| a.floats.clone()))
    }

    pub fn ints_opt(&mut self, name: &str) -> Result<Option<Vec<i64>>, GraphError> {
        Ok(self
            .attr(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    pub fn string_opt(&mut self, name: &str) -> Result<Option<String>, GraphError> {
        match self.attr(name, AttributeType::String)? {
            None => Ok(None),
            Some(a) => String::from_utf8(a.s().to_vec())
                .map(Some)
                .map_err(|_| self.attr_error(name, "is not valid UTF-8")),
        }
    }

    pub fn string(&mut self, name: &str, default: &str) -> Result<String, GraphError> {
        Ok(self
            .string_opt(name)?
            .unwrap_or_else(|| default.to_string()))
    }

    pub fn tensor_opt(&mut self, name: &str) -> Result<Option<Tensor>, GraphError> {
        match self.attr(name, AttributeType::Tensor)? {
            None => Ok(None),
            Some(a) => match &a.t {
                Some(t) => Ok(Some(self.model.tensor(t)?)),
                None => Err(self.attr_error(name, "has no tensor value")),
            },
        }
    }

    /// Graph attribute `name` (a branch or loop body) built into the IR; it may read any value
    /// of the graphs around it, which become its [`Graph::captures`].
    pub fn subgraph(&mut self, name: &str) -> Result<Graph, GraphError> {
        let Some(a) = self.attr(name, AttributeType::Graph)? else {
            return Err(self.attr_error(name, "is required"));
        };
        let Some(g) = &a.g else {
            return Err(self.attr_error(name, "has no graph value"));
        };
        crate::ir::build(self.model, g, self.registry, Some(self.scope))
    }

    /// Marks `name` as understood without reading it (attributes that only document intent).
    pub fn ignore(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    fn finish(&self) -> Result<(), GraphError> {
        match self
            .node
            .attribute
            .iter()
            .find(|a| !self.used.contains(a.name()))
        {
            Some(a) => Err(GraphError::UnsupportedAttribute {
                node: Box::new(self.node_ref.clone()),
                attr: a.name().to_string(),
            }),
            None => Ok(()),
        }
    }
}
