package pack

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
)

func TestWriteTheRealExtension(t *testing.T) {
	var a, b bytes.Buffer
	m, err := Write(os.DirFS("../../src"), &a)
	if err != nil {
		t.Fatal(err)
	}
	if m.ManifestVersion != 3 || m.Version == "" {
		t.Fatalf("manifest %+v", m)
	}
	if _, err := Write(os.DirFS("../../src"), &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two zips of the same source differ")
	}
	zr, err := zip.NewReader(bytes.NewReader(a.Bytes()), int64(a.Len()))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range zr.File {
		names[f.Name] = true
	}
	for _, want := range []string{"manifest.json", "background.js", "popup.html", "options.html", "lib/protocol.js", "icons/icon128.png"} {
		if !names[want] {
			t.Errorf("the zip has no %s", want)
		}
	}
}

func TestManifestChecks(t *testing.T) {
	for name, manifest := range map[string]string{
		"not JSON":      `{`,
		"version 2":     `{"manifest_version":2,"name":"x","version":"1"}`,
		"no version":    `{"manifest_version":3,"name":"x"}`,
		"missing popup": `{"manifest_version":3,"name":"x","version":"1","action":{"default_popup":"popup.html"}}`,
	} {
		src := fstest.MapFS{"manifest.json": {Data: []byte(manifest)}}
		if _, err := Write(src, &bytes.Buffer{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFilesSkipsDotfiles(t *testing.T) {
	src := fstest.MapFS{
		"manifest.json":  {Data: []byte(`{"manifest_version":3,"name":"x","version":"1"}`)},
		".DS_Store":      {Data: []byte("x")},
		"lib/.hidden.js": {Data: []byte("x")},
		"lib/a.js~":      {Data: []byte("x")},
		"lib/a.js":       {Data: []byte("x")},
	}
	files, err := Files(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0] != "lib/a.js" || files[1] != "manifest.json" {
		t.Fatalf("files %v", files)
	}
}

func TestUnzipRoundTrip(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "ext.zip")
	if _, err := WriteFile("../../src", out); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "unpacked")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Unzip(out, dst); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("../../src/background.js")
	got, err := os.ReadFile(filepath.Join(dst, "background.js"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("background.js after the round trip: %v", err)
	}
}
