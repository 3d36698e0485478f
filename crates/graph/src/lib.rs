//! oxgen-graph: Graph IR, the operator registry that builds typed ops, and shape rules
