//! `rogue`: a purpose-built guest that breaks the rules the SDK keeps, so
//! that the host's own checks can be seen. Hand-written in the component
//! model's text format (no SDK, no toolchain), it implements the
//! `lambdastore:lambda` world with one type, `Rogue` (no constructor):
//!
//! - `put_entry` (method): puts `log["k"] = 1` and returns `null`;
//! - `write_readonly` (method, declared readonly): does the same, which the
//!   host must refuse;
//! - `static_put` (static): does the same without an object;
//! - `calls_put_entry` (method): calls `put_entry` on its own object
//!   (a nested call), and `readonly_calls_put_entry` (readonly) does too;
//! - `spawn` (method): asks the host to spawn `put_entry` on itself;
//! - `bad_json` (method): returns `not json {` as its JSON result.
//!
//! The guest tells its functions apart by the length of their names, so
//! every name has a different length; any other name returns `null`.
//! Everything it returns is static data laid out here in the canonical ABI;
//! the describe record too, which [`describing`] replaces to build modules
//! whose description the host must refuse; [`describing_after`] makes a
//! `describe` that asks the host for what it must not.

/// A function as `describe` reports it: (name, kind, protected, readonly).
pub type Function = (&'static str, Kind, bool, bool);

/// `function-kind`, in WIT order.
#[derive(Clone, Copy)]
pub enum Kind {
    Constructor = 0,
    Method = 1,
    Static = 2,
}

/// The `Rogue` type's functions.
pub const FUNCTIONS: &[Function] = &[
    ("put_entry", Kind::Method, false, false),
    ("write_readonly", Kind::Method, false, true),
    ("static_put", Kind::Static, false, false),
    ("calls_put_entry", Kind::Method, false, false),
    ("readonly_calls_put_entry", Kind::Method, false, true),
    ("spawn", Kind::Method, false, false),
    ("bad_json", Kind::Method, false, false),
];

/// Static data of the core module, placed at `BASE` in its memory.
struct Data {
    bytes: Vec<u8>,
}

const BASE: u32 = 1024;

impl Data {
    fn addr(&self) -> u32 {
        BASE + self.bytes.len() as u32
    }
    fn align(&mut self, n: usize) {
        while self.bytes.len() % n != 0 {
            self.bytes.push(0);
        }
    }
    /// Places `s` and returns its (pointer, length).
    fn string(&mut self, s: &str) -> (u32, u32) {
        let at = self.addr();
        self.bytes.extend_from_slice(s.as_bytes());
        (at, s.len() as u32)
    }
    fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    /// The `result<string, _>` `ok(s)` as a lifted function returns it
    /// (through a pointer): discriminant at 0, payload at 8 (the error
    /// variant holds an s64).
    fn ok_string(&mut self, s: (u32, u32)) -> u32 {
        self.align(8);
        let at = self.addr();
        self.u8(0);
        self.bytes.extend_from_slice(&[0; 7]);
        self.u32(s.0);
        self.u32(s.1);
        at
    }
    /// `(data ...)` string literal of all bytes.
    fn wat_literal(&self) -> String {
        self.bytes.iter().map(|b| format!("\\{b:02x}")).collect()
    }
}

/// The component's text, describing `types` (name, functions).
/// What `describe` asks the host for before it answers: nothing, as a
/// module should, or what the host must refuse it.
#[derive(Clone, Copy)]
pub enum DescribeAsks {
    Nothing,
    /// `put` of `log["k"] = 1`.
    Put,
    /// `call` of `put_entry` on this object (its error ignored).
    Call(i64),
}

pub fn wat(types: &[(&str, &[Function])], describe_asks: DescribeAsks, min_pages: u32) -> String {
    let mut d = Data { bytes: Vec::new() };
    let sdk = d.string("hand-written WAT");
    let field = d.string("log");
    let key = d.string("k");
    let value = d.string("1");
    let null = d.string("null");
    let not_json = d.string("not json {");
    let empty_args = d.string("{}");
    let put_entry = d.string("put_entry");

    // list<field-desc>: { name: string, kind: field-kind } (12 bytes each).
    d.align(4);
    let fields = d.addr();
    d.u32(field.0);
    d.u32(field.1);
    d.u8(1); // map
    d.bytes.extend_from_slice(&[0; 3]);

    // Per type, list<function-desc>: { name, kind, protected, readonly }
    // (12 bytes each).
    let mut function_lists = Vec::new();
    for (_, functions) in types {
        let names: Vec<(u32, u32)> = functions.iter().map(|f| d.string(f.0)).collect();
        d.align(4);
        function_lists.push((d.addr(), functions.len() as u32));
        for (f, name) in functions.iter().zip(&names) {
            d.u32(name.0);
            d.u32(name.1);
            d.u8(f.1 as u8);
            d.u8(f.2 as u8);
            d.u8(f.3 as u8);
            d.u8(0);
        }
    }
    let type_names: Vec<(u32, u32)> = types.iter().map(|t| d.string(t.0)).collect();

    // list<type-desc>: { name, fields, functions } (24 bytes each).
    d.align(4);
    let type_list = d.addr();
    for (name, functions) in type_names.iter().zip(&function_lists) {
        d.u32(name.0);
        d.u32(name.1);
        d.u32(fields);
        d.u32(1);
        d.u32(functions.0);
        d.u32(functions.1);
    }

    // app-desc: { sdk, types }.
    let app_desc = d.addr();
    d.u32(sdk.0);
    d.u32(sdk.1);
    d.u32(type_list);
    d.u32(types.len() as u32);

    let ok_null = d.ok_string(null);
    let ok_not_json = d.ok_string(not_json);
    // Where the host writes the results of spawn and call (24 bytes).
    d.align(8);
    let ret_area = d.addr();
    d.bytes.extend_from_slice(&[0; 32]);
    d.align(8);
    let heap = d.addr();
    // Enough pages for the data (large descriptions need more than one).
    let pages = (heap / 65536 + 1).max(min_pages);
    let data = d.wat_literal();
    let (field_ptr, field_len) = field;
    let (key_ptr, key_len) = key;
    let (value_ptr, value_len) = value;
    let (put_entry_ptr, put_entry_len) = put_entry;
    let (args_ptr, args_len) = empty_args;
    let describe_asks = match describe_asks {
        DescribeAsks::Nothing => String::new(),
        DescribeAsks::Put => format!(
            "(call $put (i32.const {field_ptr}) (i32.const {field_len}) (i32.const {key_ptr}) (i32.const {key_len}) \
             (i32.const {value_ptr}) (i32.const {value_len}))"
        ),
        DescribeAsks::Call(target) => format!(
            "(call $call (i64.const {target}) (i32.const {put_entry_ptr}) (i32.const {put_entry_len}) \
             (i32.const {args_ptr}) (i32.const {args_len}) (i32.const {ret_area}))"
        ),
    };

    format!(
        r#"(component
  (import "lambdastore:lambda/host@0.1.0" (instance $host
    (type $call-error (variant
      (case "application" string)
      (case "bad-arguments" string)
      (case "unknown-object" s64)
      (case "unknown-function" string)
      (case "not-allowed" string)))
    (export "call-error" (type $ce (eq $call-error)))
    (export "put" (func (param "field" string) (param "key" (list u8)) (param "value" (list u8))))
    (export "call" (func (param "target" s64) (param "function" string) (param "args" string)
      (result (result string (error $ce)))))
    (export "spawn" (func (param "target" s64) (param "function" string) (param "args" string)
      (result (result (error $ce)))))))

  ;; Memory and a bump allocator, instantiated first so that the host
  ;; functions can be lowered against the memory the main module uses.
  (core module $Libc
    (memory (export "memory") {pages})
    (global $heap (mut i32) (i32.const {heap}))
    (func (export "realloc") (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
      (local $p i32) (local $end i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
      (local.set $end (i32.add (local.get $p) (local.get $size)))
      (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
        (then
          (if (i32.eq
                (memory.grow (i32.shr_u
                  (i32.add (i32.sub (local.get $end) (i32.mul (memory.size) (i32.const 65536))) (i32.const 65535))
                  (i32.const 16)))
                (i32.const -1))
            (then unreachable))))
      (global.set $heap (local.get $end))
      (if (local.get $old)
        (then (memory.copy (local.get $p) (local.get $old) (local.get $old_size))))
      (local.get $p)))
  (core instance $libc (instantiate $Libc))
  (alias core export $libc "memory" (core memory $mem))
  (alias core export $libc "realloc" (core func $realloc))

  (alias export $host "put" (func $put))
  (alias export $host "call" (func $call))
  (alias export $host "spawn" (func $spawn))
  (core func $put_lowered (canon lower (func $put) (memory $mem)))
  (core func $call_lowered (canon lower (func $call) (memory $mem) (realloc $realloc)))
  (core func $spawn_lowered (canon lower (func $spawn) (memory $mem) (realloc $realloc)))

  (core module $Main
    (import "env" "memory" (memory 1))
    (import "host" "put" (func $put (param i32 i32 i32 i32 i32 i32)))
    (import "host" "call" (func $call (param i64 i32 i32 i32 i32 i32)))
    (import "host" "spawn" (func $spawn (param i64 i32 i32 i32 i32 i32)))
    (data (i32.const {BASE}) "{data}")
    (func (export "describe") (result i32)
      {describe_asks}
      (i32.const {app_desc}))
    ;; kind, type-name (ptr, len), function (ptr, len), object, args (ptr, len)
    (func (export "dispatch") (param i32 i32 i32 i32 i32 i64 i32 i32) (result i32)
      ;; put_entry, write_readonly, static_put
      (if (i32.or (i32.or (i32.eq (local.get 4) (i32.const 9)) (i32.eq (local.get 4) (i32.const 14)))
                  (i32.eq (local.get 4) (i32.const 10)))
        (then
          (call $put (i32.const {field_ptr}) (i32.const {field_len})
                     (i32.const {key_ptr}) (i32.const {key_len})
                     (i32.const {value_ptr}) (i32.const {value_len}))
          (return (i32.const {ok_null}))))
      ;; calls_put_entry, readonly_calls_put_entry (the callee's error is ignored)
      (if (i32.or (i32.eq (local.get 4) (i32.const 15)) (i32.eq (local.get 4) (i32.const 24)))
        (then
          (call $call (local.get 5) (i32.const {put_entry_ptr}) (i32.const {put_entry_len})
                      (i32.const {args_ptr}) (i32.const {args_len}) (i32.const {ret_area}))
          (return (i32.const {ok_null}))))
      ;; spawn
      (if (i32.eq (local.get 4) (i32.const 5))
        (then
          (call $spawn (local.get 5) (i32.const {put_entry_ptr}) (i32.const {put_entry_len})
                       (i32.const {args_ptr}) (i32.const {args_len}) (i32.const {ret_area}))
          (return (i32.const {ok_null}))))
      ;; bad_json
      (if (i32.eq (local.get 4) (i32.const 8))
        (then (return (i32.const {ok_not_json}))))
      (i32.const {ok_null})))
  (core instance $main (instantiate $Main
    (with "env" (instance (export "memory" (memory $mem))))
    (with "host" (instance
      (export "put" (func $put_lowered))
      (export "call" (func $call_lowered))
      (export "spawn" (func $spawn_lowered))))))

  ;; The world's types, exported so that the exported functions may use them.
  (type $function-kind' (enum "constructor" "method" "static"))
  (export $function-kind "function-kind" (type $function-kind'))
  (type $field-kind' (enum "cell" "map" "multi-map" "set"))
  (export $field-kind "field-kind" (type $field-kind'))
  (type $field-desc' (record (field "name" string) (field "kind" $field-kind)))
  (export $field-desc "field-desc" (type $field-desc'))
  (type $function-desc' (record
    (field "name" string) (field "kind" $function-kind) (field "protected" bool) (field "readonly" bool)))
  (export $function-desc "function-desc" (type $function-desc'))
  (type $type-desc' (record
    (field "name" string) (field "fields" (list $field-desc)) (field "functions" (list $function-desc))))
  (export $type-desc "type-desc" (type $type-desc'))
  (type $app-desc' (record (field "sdk" string) (field "types" (list $type-desc))))
  (export $app-desc "app-desc" (type $app-desc'))
  (type $call-error' (variant
    (case "application" string)
    (case "bad-arguments" string)
    (case "unknown-object" s64)
    (case "unknown-function" string)
    (case "not-allowed" string)))
  (export $call-error "call-error" (type $call-error'))

  (alias core export $main "describe" (core func $describe_core))
  (alias core export $main "dispatch" (core func $dispatch_core))
  (func $describe (result $app-desc)
    (canon lift (core func $describe_core) (memory $mem)))
  (func $dispatch
    (param "kind" $function-kind) (param "type-name" string) (param "function" string)
    (param "object" s64) (param "args" string)
    (result (result string (error $call-error)))
    (canon lift (core func $dispatch_core) (memory $mem) (realloc $realloc)))
  (export "describe" (func $describe))
  (export "dispatch" (func $dispatch)))
"#
    )
}

/// The rogue application: one type, `Rogue`, with [`FUNCTIONS`].
pub fn component() -> Vec<u8> {
    describing(&[("Rogue", FUNCTIONS)])
}

/// The same code, describing `types` instead.
pub fn describing(types: &[(&str, &[Function])]) -> Vec<u8> {
    describing_after(types, DescribeAsks::Nothing)
}

/// The same code, whose `describe` first asks the host for something.
pub fn describing_after(types: &[(&str, &[Function])], describe_asks: DescribeAsks) -> Vec<u8> {
    wat::parse_str(wat(types, describe_asks, 0)).expect("the rogue component's text parses")
}

/// The rogue application with `bytes` of linear memory from the start, as
/// a Python interpreter's snapshot has.
pub fn with_memory(bytes: usize) -> Vec<u8> {
    let text = wat(&[("Rogue", FUNCTIONS)], DescribeAsks::Nothing, bytes.div_ceil(65536) as u32);
    wat::parse_str(text).expect("the rogue component's text parses")
}
