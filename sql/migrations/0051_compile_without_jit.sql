-- Migration 0051: gov.compile_policy_v1() runs without JIT. The policy tables hold a few
-- rows and have no statistics, so the planner costs the compile statement's cross joins at
-- about 144 million, far over jit_above_cost: on a server built with LLVM (PostgreSQL 15
-- from Debian here) each `gov policy apply` spent 0.76-0.79 s compiling it (EXPLAIN
-- ANALYZE: JIT 785 ms of 806, the statement's own work under a millisecond). Signature
-- unchanged. As in sql/schema/ at this revision.
ALTER FUNCTION gov.compile_policy_v1() SET jit = off;
