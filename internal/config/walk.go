package config

import (
	"encoding"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Every table of berth.toml is a Go struct, and a key is one field of it:
//
//	Warm *int `toml:"warm" berth:"check=warm"`
//
// The decoder, the merge of drop-ins, the value checks and the file:line:key
// lookup (fieldLocs) all walk these tags, so a key is spelled once. A
// field's Go type says how its value is read (kindOf); the berth tag's
// options, comma-separated, say the rest:
//
//	check=NAME   the value (each element of a list) must pass valueChecks[NAME]
//	omit=A|B     on a table field: the table without keys A and B
//	merge=KEY    on a list of entries: a later file's element with the same
//	             KEY (a string key, when set) is merged into the earlier one
//	             instead of added
//	rest=WHAT    on a list of entries: takes every key no other field names,
//	             each a table of its own ([providers.NAME]); WHAT names one
//	             in the error for a key that is not a table
//	name         the field that receives a rest entry's own key
//	types=A|B    on a [[connectors]] key: the connector types that take it
//	             (all, when absent)

// fieldKind is how the walker treats a field.
type fieldKind int

const (
	kindLeaf    fieldKind = iota // string, bool, int, a TextUnmarshaler, or a pointer to one
	kindList                     // []string, []int
	kindStrings                  // map[string]string: a table of strings, each entry located
	kindSection                  // a struct: a sub-table whose keys share the parent's fieldLocs
	kindEntry                    // *entry[T]: a table with its own fieldLocs
	kindEntries                  // []*entry[T]: an array of tables (or, with rest, named tables)
	kindTables                   // []T of structs: an array of tables inside a table, keys in its fieldLocs
	kindName                     // receives a rest entry's key; no TOML key of its own
)

// fieldSpec is one field's tags, read once per struct type.
type fieldSpec struct {
	index int
	key   string
	kind  fieldKind
	typ   reflect.Type
	check string
	omit  []string
	merge string
	rest  string
	types []string
}

var (
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	entryValueType      = reflect.TypeFor[entryValue]()
	specCache           sync.Map // reflect.Type → []fieldSpec
)

// specsOf returns the fields of a struct type that the walker handles. A
// tag it cannot read is a mistake in this package: it panics, and
// TestEveryTableIsWalkable catches it.
func specsOf(t reflect.Type) []fieldSpec {
	if s, ok := specCache.Load(t); ok {
		return s.([]fieldSpec)
	}
	var specs []fieldSpec
	for i := range t.NumField() {
		sf := t.Field(i)
		key, _, _ := strings.Cut(sf.Tag.Get("toml"), ",")
		f := fieldSpec{index: i, key: key, typ: sf.Type}
		for opt := range strings.SplitSeq(sf.Tag.Get("berth"), ",") {
			name, value, _ := strings.Cut(opt, "=")
			switch name {
			case "":
			case "check":
				if _, ok := valueChecks[value]; !ok {
					panic(fmt.Sprintf("config: %s.%s: no value check %q", t.Name(), sf.Name, value))
				}
				f.check = value
			case "omit":
				f.omit = strings.Split(value, "|")
			case "merge":
				f.merge = value
			case "rest":
				f.rest = value
			case "name":
				f.kind = kindName
			case "types":
				f.types = strings.Split(value, "|")
			default:
				panic(fmt.Sprintf("config: %s.%s: unknown berth tag option %q", t.Name(), sf.Name, opt))
			}
		}
		switch {
		case f.kind == kindName:
		case key == "" && f.rest == "" || key == "-":
			continue
		default:
			f.kind = kindOf(sf.Type)
		}
		specs = append(specs, f)
	}
	specCache.Store(t, specs)
	return specs
}

func kindOf(t reflect.Type) fieldKind {
	switch {
	case t.Implements(entryValueType):
		return kindEntry
	case t.Kind() == reflect.Slice && t.Elem().Implements(entryValueType):
		return kindEntries
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct && !reflect.PointerTo(t.Elem()).Implements(textUnmarshalerType):
		return kindTables
	case t.Kind() == reflect.Slice:
		return kindList
	case t.Kind() == reflect.Map:
		return kindStrings
	case t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(textUnmarshalerType):
		return kindSection
	}
	return kindLeaf
}

// knownKeys are a table's keys, without omitted ones.
func knownKeys(specs []fieldSpec, omit []string) map[string]*fieldSpec {
	known := map[string]*fieldSpec{}
	for i := range specs {
		if f := &specs[i]; f.key != "" && f.kind != kindName && !slices.Contains(omit, f.key) {
			known[f.key] = f
		}
	}
	return known
}

// unknownKeyExplainer is a table that has a better word than "unknown key"
// for some keys (MeepaGateway's, which berth refuses on purpose).
type unknownKeyExplainer interface {
	explainUnknownKey(name string) (string, bool)
}

// decodeTable decodes a TOML table into the struct dst, recording where each
// key was set in at under prefix.
func (d *decoder) decodeTable(p keyPath, raw any, dst reflect.Value, at fieldLocs, prefix string, omit []string) {
	m, ok := raw.(map[string]any)
	if !ok {
		d.wrongType(p, "a table", raw)
		return
	}
	specs := specsOf(dst.Type())
	known := knownKeys(specs, omit)
	var rest *fieldSpec
	for i := range specs {
		if specs[i].rest != "" {
			rest = &specs[i]
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		kp := d.child(p, name)
		f, isKnown := known[name]
		switch {
		case isKnown:
			d.decodeField(kp, m[name], dst.Field(f.index), at, joinKey(prefix, name), f)
		case rest != nil:
			if _, isTable := m[name].(map[string]any); !isTable {
				d.fail(kp, "unknown key (known keys: %s; a %s is a table, [%s])", strings.Join(slices.Sorted(maps.Keys(known)), ", "), rest.rest, kp.key)
				continue
			}
			d.appendEntry(kp, m[name], dst.Field(rest.index), name)
		default:
			if e, ok := dst.Addr().Interface().(unknownKeyExplainer); ok {
				if msg, ok := e.explainUnknownKey(name); ok {
					d.fail(kp, "%s", msg)
					continue
				}
			}
			d.fail(kp, "unknown key (known keys: %s)", strings.Join(slices.Sorted(maps.Keys(known)), ", "))
		}
	}
}

// appendEntry decodes one table of its own and appends it to the list
// field dst; name is its key when the list takes named tables.
func (d *decoder) appendEntry(p keyPath, raw any, dst reflect.Value, name string) {
	e := newEntry(dst.Type().Elem(), d.loc(p))
	if name != "" {
		setName(e, name)
	}
	d.decodeTable(p, raw, e.value(), e.locs(), "", nil)
	dst.Set(reflect.Append(dst, reflect.ValueOf(e)))
}

func (d *decoder) decodeField(p keyPath, raw any, dst reflect.Value, at fieldLocs, rel string, f *fieldSpec) {
	switch f.kind {
	case kindSection:
		d.decodeTable(p, raw, dst, at, rel, f.omit)
	case kindEntry:
		if dst.IsNil() {
			dst.Set(reflect.ValueOf(newEntry(dst.Type(), d.loc(p))))
		}
		e := dst.Interface().(entryValue)
		*e.selfLoc() = d.loc(p)
		d.decodeTable(p, raw, e.value(), e.locs(), "", f.omit)
	case kindEntries:
		elems, ok := arrayOfTables(raw)
		if !ok {
			d.wrongType(p, "an array of tables", raw)
			return
		}
		for i, v := range elems {
			d.appendEntry(d.elem(p, i), v, dst, "")
		}
	case kindTables:
		d.decodeTables(p, raw, dst, at, rel)
	case kindStrings:
		d.decodeStrings(p, raw, dst, at, rel)
	case kindList:
		d.decodeList(p, raw, dst, at, rel, f)
	case kindLeaf:
		v := dst
		if dst.Kind() == reflect.Pointer {
			v = reflect.New(dst.Type().Elem()).Elem()
		}
		if !d.decodeLeaf(p, raw, v, f) {
			return
		}
		if dst.Kind() == reflect.Pointer {
			dst.Set(v.Addr())
		}
		at[rel] = d.loc(p)
		d.checkValue(p, f, v)
	}
}

// tomlWants is what a Go kind is written as, for wrong-type errors.
var tomlWants = map[reflect.Kind]string{
	reflect.String:  "a string",
	reflect.Bool:    "a boolean (true or false)",
	reflect.Int:     "an integer",
	reflect.Float64: "a number",
}

var listWants = map[reflect.Kind]string{
	reflect.String: "an array of strings",
	reflect.Int:    "an array of integers",
}

// decodeLeaf reads one value into v; false when it is of the wrong type or
// a typed value refuses it.
func (d *decoder) decodeLeaf(p keyPath, raw any, v reflect.Value, f *fieldSpec) bool {
	if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
		s, ok := raw.(string)
		if !ok {
			d.wrongType(p, "a string", raw)
			return false
		}
		// A size's rule is the key's (its minimum, what its errors call it).
		if rule, ok := valueChecks[f.check].(sizeRule); ok {
			n, msg := rule.check(s)
			if msg != "" {
				d.fail(p, "%s", msg)
				return false
			}
			v.SetInt(int64(n))
			return true
		}
		if err := u.UnmarshalText([]byte(s)); err != nil {
			d.fail(p, "%s", err)
			return false
		}
		return true
	}
	switch v.Kind() {
	case reflect.String:
		if s, ok := raw.(string); ok {
			v.SetString(s)
			return true
		}
	case reflect.Bool:
		if b, ok := raw.(bool); ok {
			v.SetBool(b)
			return true
		}
	case reflect.Int:
		if n, ok := raw.(int64); ok {
			v.SetInt(n)
			return true
		}
	case reflect.Float64:
		switch n := raw.(type) {
		case float64:
			v.SetFloat(n)
			return true
		case int64:
			v.SetFloat(float64(n))
			return true
		}
	default:
		panic(fmt.Sprintf("config: %s: no TOML value decodes into %s", p.key, v.Type()))
	}
	d.wrongType(p, tomlWants[v.Kind()], raw)
	return false
}

func (d *decoder) decodeList(p keyPath, raw any, dst reflect.Value, at fieldLocs, rel string, f *fieldSpec) {
	elemType := dst.Type().Elem()
	vs, ok := raw.([]any)
	if !ok {
		d.wrongType(p, listWants[elemType.Kind()], raw)
		return
	}
	out := reflect.MakeSlice(dst.Type(), len(vs), len(vs))
	l := d.loc(p)
	for i, e := range vs {
		if !d.decodeLeaf(d.elem(p, i), e, out.Index(i), &fieldSpec{}) {
			return
		}
		l.elems = append(l.elems, d.elem(p, i).line)
	}
	dst.Set(out)
	at[rel] = l
	for i := range vs {
		d.checkValue(d.elem(p, i), f, out.Index(i))
	}
}

// decodeTables reads an array of tables inside a table ([[agents.mcp]]):
// element i's keys are located as rel[i].KEY in the enclosing table's
// fieldLocs, and a later file replaces the array as a whole.
func (d *decoder) decodeTables(p keyPath, raw any, dst reflect.Value, at fieldLocs, rel string) {
	elems, ok := arrayOfTables(raw)
	if !ok {
		d.wrongType(p, "an array of tables", raw)
		return
	}
	out := reflect.MakeSlice(dst.Type(), len(elems), len(elems))
	l := d.loc(p)
	for i, v := range elems {
		ep := d.elem(p, i)
		d.decodeTable(ep, v, out.Index(i), at, indexKey(rel, i), nil)
		at[indexKey(rel, i)] = d.loc(ep)
		l.elems = append(l.elems, ep.line)
	}
	dst.Set(out)
	at[rel] = l
}

// arrayOfTables is the elements of [[x]] tables or of an inline array; an
// element that is not a table is refused when it is decoded.
func arrayOfTables(raw any) ([]any, bool) {
	switch vs := raw.(type) {
	case []map[string]any:
		elems := make([]any, len(vs))
		for i, v := range vs {
			elems[i] = v
		}
		return elems, true
	case []any:
		return vs, true
	}
	return nil, false
}

// decodeStrings reads a table of strings; each entry gets its own location
// (rel.NAME), so a check can point at the entry's line.
func (d *decoder) decodeStrings(p keyPath, raw any, dst reflect.Value, at fieldLocs, rel string) {
	m, ok := raw.(map[string]any)
	if !ok {
		d.wrongType(p, "a table of strings", raw)
		return
	}
	vars := make(map[string]string, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		kp := d.child(p, name)
		value, ok := m[name].(string)
		if !ok {
			d.wrongType(kp, "a string", m[name])
			continue
		}
		vars[name] = value
		at[joinKey(rel, name)] = d.loc(kp)
	}
	dst.Set(reflect.ValueOf(vars))
	at[rel] = d.loc(p)
}

// checkValue runs the field's value check on v, which was just read at p.
func (d *decoder) checkValue(p keyPath, f *fieldSpec, v reflect.Value) {
	var msg string
	switch check := valueChecks[f.check].(type) {
	case func(string) string:
		msg = check(v.String())
	case func(int) string:
		msg = check(int(v.Int()))
	case func(Duration) string:
		msg = check(Duration(v.Int()))
	case func(float64) string:
		msg = check(v.Float())
	}
	if msg != "" {
		d.fail(p, "%s", msg)
	}
}

// mergeTable applies the keys src set (srcAt) onto dst. A key's value is
// replaced as a whole, lists and tables of strings too.
func mergeTable(dst, src reflect.Value, dstAt, srcAt fieldLocs, prefix string) {
	for _, f := range specsOf(dst.Type()) {
		df, sf := dst.Field(f.index), src.Field(f.index)
		rel := joinKey(prefix, f.key)
		switch f.kind {
		case kindLeaf, kindList:
			if l, ok := srcAt[rel]; ok {
				df.Set(sf)
				dstAt[rel] = l
			}
		case kindStrings:
			if l, ok := srcAt[rel]; ok {
				for _, k := range df.MapKeys() {
					delete(dstAt, joinKey(rel, k.String()))
				}
				for _, k := range sf.MapKeys() {
					dstAt[joinKey(rel, k.String())] = srcAt[joinKey(rel, k.String())]
				}
				df.Set(sf)
				dstAt[rel] = l
			}
		case kindTables:
			if l, ok := srcAt[rel]; ok {
				for key := range dstAt {
					if strings.HasPrefix(key, rel+"[") {
						delete(dstAt, key)
					}
				}
				for key, el := range srcAt {
					if strings.HasPrefix(key, rel+"[") {
						dstAt[key] = el
					}
				}
				df.Set(sf)
				dstAt[rel] = l
			}
		case kindSection:
			mergeTable(df, sf, dstAt, srcAt, rel)
		case kindEntry:
			if sf.IsNil() {
				continue
			}
			if df.IsNil() {
				df.Set(reflect.ValueOf(newEntry(df.Type(), loc{})))
			}
			mergeEntry(df.Interface().(entryValue), sf.Interface().(entryValue))
		case kindEntries:
			for i := range sf.Len() {
				s := sf.Index(i).Interface().(entryValue)
				j := matchEntry(df, s, &f)
				if j < 0 {
					e := newEntry(df.Type().Elem(), *s.selfLoc())
					if f.rest != "" {
						setName(e, entryName(s))
					}
					df.Set(reflect.Append(df, reflect.ValueOf(e)))
					j = df.Len() - 1
				}
				mergeEntry(df.Index(j).Interface().(entryValue), s)
			}
		}
	}
}

func mergeEntry(d, s entryValue) {
	if d.selfLoc().file == "" {
		*d.selfLoc() = *s.selfLoc()
	}
	mergeTable(d.value(), s.value(), d.locs(), s.locs(), "")
}

// matchEntry is the index in dst of the entry s merges into, or -1 when s
// is a new one: the same name for named tables, the same merge key (set and
// not empty) for merge=KEY, never otherwise.
func matchEntry(dst reflect.Value, s entryValue, f *fieldSpec) int {
	var key func(entryValue) (string, bool)
	switch {
	case f.rest != "":
		key = func(e entryValue) (string, bool) { return entryName(e), true }
	case f.merge != "":
		key = func(e entryValue) (string, bool) { return stringKey(e, f.merge) }
	default:
		return -1
	}
	want, ok := key(s)
	if !ok || want == "" {
		return -1
	}
	for i := range dst.Len() {
		if got, _ := key(dst.Index(i).Interface().(entryValue)); got == want {
			return i
		}
	}
	return -1
}

// stringKey is the value of an entry's string key.
func stringKey(e entryValue, key string) (string, bool) {
	v := e.value()
	for _, f := range specsOf(v.Type()) {
		if f.key == key {
			return v.Field(f.index).String(), true
		}
	}
	return "", false
}

func entryName(e entryValue) string {
	v := e.value()
	for _, f := range specsOf(v.Type()) {
		if f.kind == kindName {
			return v.Field(f.index).String()
		}
	}
	return ""
}

func setName(e entryValue, name string) {
	v := e.value()
	for _, f := range specsOf(v.Type()) {
		if f.kind == kindName {
			v.Field(f.index).SetString(name)
		}
	}
}

// newEntry makes an empty *entry[T] of pointer type t, located at self.
func newEntry(t reflect.Type, self loc) entryValue {
	e := reflect.New(t.Elem()).Interface().(entryValue)
	e.init(self)
	return e
}

// allocateEntries gives every nil *entry[T] field of a table its empty
// entry, so a table no file wrote still has fieldLocs to ask.
func allocateEntries(v reflect.Value) {
	for _, f := range specsOf(v.Type()) {
		switch df := v.Field(f.index); f.kind {
		case kindEntry:
			if df.IsNil() {
				df.Set(reflect.ValueOf(newEntry(df.Type(), loc{})))
			}
		case kindSection:
			allocateEntries(df)
		}
	}
}
