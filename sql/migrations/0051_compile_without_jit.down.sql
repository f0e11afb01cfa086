-- Migration 0051, down: gov.compile_policy_v1() with the server's JIT setting again.
ALTER FUNCTION gov.compile_policy_v1() RESET jit;
