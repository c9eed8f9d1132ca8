package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// The OpenAPI document is written by hand; these tests keep it and the
// registered routes in step, and keep it well formed: every operation is
// named and answers something, every $ref resolves, every path parameter is
// declared, every request body is as strict as the handlers' decoding, and
// the security it states is the security the server applies.

// openAPIDoc fetches the document the running server serves.
func openAPIDoc(t *testing.T, b *broker) map[string]any {
	t.Helper()
	resp, err := b.http.Client().Get(b.http.URL + "/api/v1/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	return doc
}

// openAPIMethods are the path item fields that are operations.
var openAPIMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

type openAPIOp struct {
	method, path string // method upper case, path as the document writes it
	op           map[string]any
	item         map[string]any // the path item: path-level parameters
}

func (o openAPIOp) String() string { return o.method + " " + o.path }

// openAPIOps lists the document's operations, sorted.
func openAPIOps(t *testing.T, doc map[string]any) []openAPIOp {
	t.Helper()
	paths, ok := doc["paths"].(map[string]any)
	require.True(t, ok, "paths is not an object")
	var ops []openAPIOp
	for p, v := range paths {
		item, ok := v.(map[string]any)
		require.True(t, ok, "path item %s is not an object", p)
		for _, m := range openAPIMethods {
			if op, ok := item[m]; ok {
				o, ok := op.(map[string]any)
				require.True(t, ok, "%s %s is not an object", m, p)
				ops = append(ops, openAPIOp{method: strings.ToUpper(m), path: p, op: o, item: item})
			}
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].String() < ops[j].String() })
	return ops
}

var ginParam = regexp.MustCompile(`[:*]([A-Za-z0-9_]+)`)

// registeredRoutes lists the routes of the server's gin engine as
// "METHOD /path/{param}".
func registeredRoutes(t *testing.T, b *broker) []string {
	t.Helper()
	engine, ok := b.srv.Handler().(interface{ Routes() gin.RoutesInfo })
	require.True(t, ok, "the server's handler is not a gin engine: %T", b.srv.Handler())
	var out []string
	for _, r := range engine.Routes() {
		out = append(out, r.Method+" "+ginParam.ReplaceAllString(r.Path, "{$1}"))
	}
	sort.Strings(out)
	require.NotEmpty(t, out)
	return out
}

// resolvePointer resolves a local reference ("#/a/b") in doc.
func resolvePointer(doc map[string]any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("not a local reference")
	}
	var cur any = doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%q is not inside an object", tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("no %q", tok)
		}
	}
	return cur, nil
}

// deref follows $ref until v is not a reference.
func deref(t *testing.T, doc map[string]any, v any) map[string]any {
	t.Helper()
	for range 16 {
		m, ok := v.(map[string]any)
		require.True(t, ok, "%v is not an object", v)
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		v, _ = resolvePointer(doc, ref)
	}
	t.Fatalf("reference chain too long at %v", v)
	return nil
}

// collectRefs walks v and calls f with the location and target of every $ref.
func collectRefs(v any, at string, f func(at, ref string)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == "$ref" {
				if s, ok := e.(string); ok {
					f(at, s)
					continue
				}
			}
			collectRefs(e, at+"/"+k, f)
		}
	case []any:
		for i, e := range x {
			collectRefs(e, fmt.Sprintf("%s/%d", at, i), f)
		}
	}
}

func TestOpenAPIDocument(t *testing.T) {
	b := setup(t)
	doc := openAPIDoc(t, b)

	// (a) An OpenAPI 3 document with info and paths.
	require.Regexp(t, `^3\.\d+\.\d+$`, doc["openapi"])
	info, ok := doc["info"].(map[string]any)
	require.True(t, ok, "info is not an object")
	require.NotEmpty(t, info["title"])
	require.NotEmpty(t, info["version"])
	ops := openAPIOps(t, doc)
	require.NotEmpty(t, ops)

	// (b) and (c): the documented operations are exactly the routes.
	var documented []string
	for _, o := range ops {
		documented = append(documented, o.String())
	}
	routes := registeredRoutes(t, b)
	var undocumented, unregistered []string
	for _, r := range routes {
		// What only replicas ask each other is no part of the API.
		if strings.Contains(r, " /internal/") {
			continue
		}
		if !slices.Contains(documented, r) {
			undocumented = append(undocumented, r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(routes, d) {
			unregistered = append(unregistered, d)
		}
	}
	require.Empty(t, undocumented, "routes registered but missing from server/openapi.json")
	require.Empty(t, unregistered, "operations in server/openapi.json that no route serves")

	// (d) Named operations that answer something.
	ids := map[string]string{}
	for _, o := range ops {
		id, _ := o.op["operationId"].(string)
		require.NotEmpty(t, id, "%s has no operationId", o)
		require.NotContains(t, ids, id, "%s and %s share an operationId", o, ids[id])
		ids[id] = o.String()
		require.NotEmpty(t, o.op["summary"], "%s has no summary", o)
		resps, ok := o.op["responses"].(map[string]any)
		require.True(t, ok && len(resps) > 0, "%s has no response", o)
		_, ok = o.op["security"].([]any)
		require.True(t, ok, "%s states no security (an unauthenticated operation says security: [])", o)
	}

	// (d) Every $ref resolves, and every component is used.
	used := map[string]bool{}
	collectRefs(doc, "#", func(at, ref string) {
		_, err := resolvePointer(doc, ref)
		require.NoError(t, err, "%s: $ref %q", at, ref)
		used[ref] = true
	})
	components, _ := doc["components"].(map[string]any)
	for kind, v := range components {
		if kind == "securitySchemes" {
			continue // used by name in security, not by $ref
		}
		for name := range v.(map[string]any) {
			require.True(t, used["#/components/"+kind+"/"+name], "components/%s/%s is never referenced", kind, name)
		}
	}
	schemes, _ := components["securitySchemes"].(map[string]any)
	require.Contains(t, schemes, "bearer")

	// Every templated path segment is a declared path parameter, and every
	// declared path parameter is in the template.
	tmpl := regexp.MustCompile(`\{([^}]+)\}`)
	for _, o := range ops {
		var want []string
		for _, m := range tmpl.FindAllStringSubmatch(o.path, -1) {
			want = append(want, m[1])
		}
		var got []string
		for _, list := range []any{o.item["parameters"], o.op["parameters"]} {
			ps, _ := list.([]any)
			for _, p := range ps {
				pm := deref(t, doc, p)
				require.NotEmpty(t, pm["name"], "%s: a parameter has no name", o)
				require.Contains(t, []any{"path", "query", "header", "cookie"}, pm["in"], "%s: parameter %v", o, pm["name"])
				require.NotNil(t, pm["schema"], "%s: parameter %v has no schema", o, pm["name"])
				if pm["in"] == "path" {
					require.Equal(t, true, pm["required"], "%s: path parameter %v must be required", o, pm["name"])
					got = append(got, pm["name"].(string))
				}
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		require.Equal(t, want, got, "%s: path parameters", o)
	}

	// Bodies are decoded strictly: their schemas say so.
	for _, o := range ops {
		rb, ok := o.op["requestBody"]
		if !ok {
			continue
		}
		content, _ := deref(t, doc, rb)["content"].(map[string]any)
		mt, ok := content["application/json"].(map[string]any)
		require.True(t, ok, "%s: the request body is not application/json", o)
		schema := deref(t, doc, mt["schema"])
		require.Equal(t, "object", schema["type"], "%s: body", o)
		require.Equal(t, false, schema["additionalProperties"], "%s: bodies are strict: additionalProperties must be false", o)
	}

	// The error envelope lists every code the API answers.
	codes, err := resolvePointer(doc, "#/components/schemas/ErrorCode/enum")
	require.NoError(t, err)
	for _, c := range []string{
		cheetah.CodeInvalidRequest, cheetah.CodeUnauthorized, cheetah.CodeForbidden, cheetah.CodeNotFound,
		cheetah.CodeNoContextAvailable, cheetah.CodePayloadTooLarge, cheetah.CodeLeaseLost,
		cheetah.CodeRateLimited, cheetah.CodeStoreUnavailable, cheetah.CodeOverloaded, "internal",
		cheetah.CodeMethodNotAllowed,
	} {
		require.Contains(t, codes, c, "the ErrorCode enum lacks %s", c)
	}

	// Every operation documents the 405 a wrong method gets, with its Allow
	// header; the 401 documents WWW-Authenticate.
	for _, o := range ops {
		resps := o.op["responses"].(map[string]any)
		require.Contains(t, resps, "405", "%s does not document 405", o)
	}
	allow, err := resolvePointer(doc, "#/components/responses/MethodNotAllowed/headers/Allow")
	require.NoError(t, err)
	require.NotNil(t, allow)
	www, err := resolvePointer(doc, "#/components/responses/Unauthorized/headers/WWW-Authenticate")
	require.NoError(t, err)
	require.NotNil(t, www)
}

// TestOpenAPISecurity checks the security each operation states against the
// server: an authenticated operation refuses a request without a key (401)
// and one with a key of a kind it does not list in x-key-kinds (403); an
// unauthenticated one answers without a key.
func TestOpenAPISecurity(t *testing.T) {
	b := setup(t)
	doc := openAPIDoc(t, b)
	keyOf := map[string]string{"client": b.client, "app": b.appKey, "admin": b.adminKey}
	param := regexp.MustCompile(`\{[^}]+\}`)
	call := func(o openAPIOp, key string) int {
		t.Helper()
		req, err := http.NewRequest(o.method, b.http.URL+param.ReplaceAllString(o.path, "x"), nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := b.http.Client().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, o := range openAPIOps(t, doc) {
		sec := o.op["security"].([]any)
		if len(sec) == 0 {
			require.NotEqual(t, http.StatusUnauthorized, call(o, ""), "%s is documented as unauthenticated", o)
			require.NotContains(t, o.op, "x-key-kinds", o.String())
			continue
		}
		require.Equal(t, http.StatusUnauthorized, call(o, ""), "%s is documented as authenticated", o)
		kinds, ok := o.op["x-key-kinds"].([]any)
		require.True(t, ok && len(kinds) > 0, "%s: no x-key-kinds", o)
		desc, _ := o.op["description"].(string)
		if slices.Contains(kinds, any("app")) {
			require.Contains(t, desc, "app or admin key", "%s: the description names the key kinds", o)
		} else {
			require.Contains(t, desc, "admin key", "%s: the description names the key kinds", o)
		}
		for kind, key := range keyOf {
			if slices.Contains(kinds, any(kind)) {
				// Only probe the kinds that may: the lowest one is enough to
				// show it gets past authentication. Requests carry no body
				// nor lease, so an app route stops at validation; admin
				// routes are not called with an admin key (one would revoke).
				if kind == "app" {
					st := call(o, key)
					require.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, st, "%s with an app key", o)
				}
				continue
			}
			require.Equal(t, http.StatusForbidden, call(o, key), "%s with a %s key", o, kind)
		}
	}
}
