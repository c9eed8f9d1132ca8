// Package quota reads the quota funnel of DESIGN §10: caps on concurrent
// leases per quota and level (global, tenant, user), from a YAML file.
//
//	quotas:
//	  - name: browsers
//	    match: {client_type: browser}
//	    levels: {global: 100, tenant: 20, user: 2}
//	tenants:
//	  acme: {browsers: {tenant: 40, user: 4}}
//
// A file is taken whole or not at all: bad YAML, an unknown field, a cap
// below 1, a tenant override naming an unknown quota or setting global all
// refuse it. The registry counts the slots (context/registry/quotas.go).
package quota

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Level is one level of the funnel.
type Level string

// The levels, narrow to wide: the order they are checked in.
const (
	User   Level = "user"
	Tenant Level = "tenant"
	Global Level = "global"
)

// Levels lists the levels narrow to wide.
var Levels = [...]Level{User, Tenant, Global}

// Caps are a quota's caps by level; 0 is no cap (the level passes).
type Caps struct {
	Global int `json:"global,omitempty"`
	Tenant int `json:"tenant,omitempty"`
	User   int `json:"user,omitempty"`
}

// Of returns the cap of level l.
func (c Caps) Of(l Level) int {
	switch l {
	case Global:
		return c.Global
	case Tenant:
		return c.Tenant
	}
	return c.User
}

// Match says which acquires a quota governs: those that ask for
// ClientType (when set) and request all of Labels.
type Match struct {
	ClientType cheetah.ClientType `json:"client_type,omitempty"`
	Labels     map[string]string  `json:"labels,omitempty"`
}

// Quota is one quota as the file defines it.
type Quota struct {
	Name  string `json:"name"`
	Match Match  `json:"match"`
	Caps  Caps   `json:"levels"`
	// Overrides are the per-tenant caps of tenant and user, merged over
	// Caps (global is never overridden).
	Overrides map[string]Caps `json:"overrides,omitempty"`
}

// Governs reports whether an acquire for clientType requesting labels is
// governed by q. It does not allocate.
func (q *Quota) Governs(clientType cheetah.ClientType, labels map[string]string) bool {
	if q.Match.ClientType != "" && q.Match.ClientType != clientType {
		return false
	}
	for k, v := range q.Match.Labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// CapsFor returns q's caps for tenant: its override merged over the
// quota's own.
func (q *Quota) CapsFor(tenant string) Caps {
	c := q.Caps
	if o, ok := q.Overrides[tenant]; ok {
		if o.Tenant != 0 {
			c.Tenant = o.Tenant
		}
		if o.User != 0 {
			c.User = o.User
		}
	}
	return c
}

// Set is a parsed quota file: its quotas in file order. A nil *Set has no
// quotas. It is never changed once made.
type Set struct {
	Quotas []*Quota
}

// Len is how many quotas s has.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.Quotas)
}

// Governing appends to dst the indexes of the quotas that govern an acquire
// for clientType requesting labels, and returns it.
func (s *Set) Governing(dst []int, clientType cheetah.ClientType, labels map[string]string) []int {
	if s == nil {
		return dst
	}
	for i, q := range s.Quotas {
		if q.Governs(clientType, labels) {
			dst = append(dst, i)
		}
	}
	return dst
}

// The file's shape. Pointers tell an absent cap from a 0, which is refused.
type fileDoc struct {
	Quotas  []fileQuota                        `yaml:"quotas"`
	Tenants map[string]map[string]fileOverride `yaml:"tenants"`
}

type fileQuota struct {
	Name   string     `yaml:"name"`
	Match  fileMatch  `yaml:"match"`
	Levels fileLevels `yaml:"levels"`
}

type fileMatch struct {
	ClientType string            `yaml:"client_type"`
	Labels     map[string]string `yaml:"labels"`
}

type fileLevels struct {
	Global *int `yaml:"global"`
	Tenant *int `yaml:"tenant"`
	User   *int `yaml:"user"`
}

type fileOverride struct {
	Global *int `yaml:"global"` // refused: an override never sets global
	Tenant *int `yaml:"tenant"`
	User   *int `yaml:"user"`
}

// Load reads and parses the file at path.
func Load(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("quota file: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("quota file %s: %w", path, err)
	}
	return s, nil
}

// Parse parses a quota file. Unknown fields are refused, as is more than
// one YAML document.
func Parse(b []byte) (*Set, error) {
	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("the file must hold one YAML document")
	}
	s := &Set{}
	byName := map[string]*Quota{}
	for i, fq := range doc.Quotas {
		q, err := fq.quota()
		if err != nil {
			return nil, fmt.Errorf("quotas[%d]: %w", i, err)
		}
		if byName[q.Name] != nil {
			return nil, fmt.Errorf("quotas[%d]: the name %q is used twice", i, q.Name)
		}
		byName[q.Name] = q
		s.Quotas = append(s.Quotas, q)
	}
	for tenant, byQuota := range doc.Tenants {
		if err := cheetah.CheckID("a tenant id", tenant); err != nil {
			return nil, fmt.Errorf("tenants: %q: %w", tenant, err)
		}
		for name, o := range byQuota {
			q := byName[name]
			if q == nil {
				return nil, fmt.Errorf("tenants.%s: no quota is named %q", tenant, name)
			}
			if o.Global != nil {
				return nil, fmt.Errorf("tenants.%s.%s: an override may set tenant and user, never global", tenant, name)
			}
			var c Caps
			var err error
			if c.Tenant, err = capOf(o.Tenant, "tenant"); err != nil {
				return nil, fmt.Errorf("tenants.%s.%s: %w", tenant, name, err)
			}
			if c.User, err = capOf(o.User, "user"); err != nil {
				return nil, fmt.Errorf("tenants.%s.%s: %w", tenant, name, err)
			}
			if q.Overrides == nil {
				q.Overrides = map[string]Caps{}
			}
			q.Overrides[tenant] = c
		}
	}
	return s, nil
}

func (fq fileQuota) quota() (*Quota, error) {
	if err := cheetah.CheckID("name", fq.Name); err != nil {
		return nil, err
	}
	q := &Quota{Name: fq.Name, Match: Match{ClientType: cheetah.ClientType(fq.Match.ClientType), Labels: fq.Match.Labels}}
	if q.Match.ClientType != "" && !q.Match.ClientType.Valid() {
		return nil, errors.New("match.client_type must be browser or console")
	}
	if err := cheetah.CheckLabels("match.labels", q.Match.Labels); err != nil {
		return nil, err
	}
	var err error
	if q.Caps.Global, err = capOf(fq.Levels.Global, "global"); err != nil {
		return nil, err
	}
	if q.Caps.Tenant, err = capOf(fq.Levels.Tenant, "tenant"); err != nil {
		return nil, err
	}
	if q.Caps.User, err = capOf(fq.Levels.User, "user"); err != nil {
		return nil, err
	}
	if q.Caps == (Caps{}) {
		return nil, errors.New("levels must cap at least one of global, tenant and user")
	}
	return q, nil
}

func capOf(v *int, name string) (int, error) {
	if v == nil {
		return 0, nil
	}
	if *v < 1 {
		return 0, fmt.Errorf("the %s cap must be at least 1 (got %d)", name, *v)
	}
	return *v, nil
}
