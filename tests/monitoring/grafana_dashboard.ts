// The type a provisioned Grafana dashboard JSON must satisfy, for tests/test_monitoring.py.
//
// The test writes `const checked: StrictDashboard = <dashboard JSON>;` next to this
// file and runs `tsc --noEmit` on it. Assigning the JSON as an object literal (rather
// than importing it with resolveJsonModule) keeps TypeScript's excess-property check
// on every nested object, so a misspelt key fails, and keeps string literals literal.
//
// Loose<T> only turns the schema's string enums (ThresholdsMode.Absolute = "absolute",
// ...) into the union of their values: JSON holds "absolute", never the enum member,
// and a string literal is not assignable to a TypeScript string enum. Everything else
// (required keys, value types, unknown keys) is checked as @grafana/schema declares it.
import type { Dashboard } from '@grafana/schema';

type Loose<T> =
  T extends string ? (string extends T ? T : `${T}`) :
  T extends readonly (infer U)[] ? Loose<U>[] :
  T extends object ? { [K in keyof T]: Loose<T[K]> } :
  T;

export type StrictDashboard = Loose<Dashboard>;
