//! oxgen-exec: The native backend: execution plan, buffer reuse, typed ops dispatched to kernels
