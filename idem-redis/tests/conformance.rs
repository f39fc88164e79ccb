//! The shared conformance suite against `RedisStore` on one real Redis.

mod common;

idem_core::conformance_tests!(common::Redis { cluster: false });
idem_ops::operator_tests!(common::Redis { cluster: false });
