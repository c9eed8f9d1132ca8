// Package pack builds the browser extension's zip from its source folder:
// the files as they are (the extension has no build step), in a fixed order
// with fixed times, so the same source always gives the same zip.
package pack

import (
	"archive/zip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// Manifest is the part of manifest.json that pack checks.
type Manifest struct {
	ManifestVersion int    `json:"manifest_version"`
	Name            string `json:"name"`
	Version         string `json:"version"`
	Background      struct {
		ServiceWorker string `json:"service_worker"`
	} `json:"background"`
	Action struct {
		DefaultPopup string            `json:"default_popup"`
		DefaultIcon  map[string]string `json:"default_icon"`
	} `json:"action"`
	OptionsUI struct {
		Page string `json:"page"`
	} `json:"options_ui"`
	Icons map[string]string `json:"icons"`
}

// epoch is the modification time of every entry: zip cannot store times
// before 1980, and a fixed time keeps the archive reproducible.
var epoch = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)

// ReadManifest reads and checks the manifest of the extension in src: a
// Manifest V3 extension whose every referenced file exists.
func ReadManifest(src fs.FS) (Manifest, error) {
	var m Manifest
	b, err := fs.ReadFile(src, "manifest.json")
	if err != nil {
		return m, fmt.Errorf("pack: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("pack: manifest.json: %w", err)
	}
	if m.ManifestVersion != 3 {
		return m, fmt.Errorf("pack: manifest_version is %d, want 3", m.ManifestVersion)
	}
	if m.Name == "" || m.Version == "" {
		return m, errors.New("pack: manifest.json needs a name and a version")
	}
	refs := []string{m.Background.ServiceWorker, m.Action.DefaultPopup, m.OptionsUI.Page}
	for _, p := range m.Action.DefaultIcon {
		refs = append(refs, p)
	}
	for _, p := range m.Icons {
		refs = append(refs, p)
	}
	for _, p := range refs {
		if p == "" {
			continue
		}
		if _, err := fs.Stat(src, p); err != nil {
			return m, fmt.Errorf("pack: manifest.json names %s: %w", p, err)
		}
	}
	return m, nil
}

// Files lists the files of the extension in src, sorted, leaving out
// dotfiles and editor backups.
func Files(src fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := path.Base(p)
		if p != "." && (strings.HasPrefix(base, ".") || strings.HasSuffix(base, "~")) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	slices.Sort(files)
	return files, err
}

// Write writes the zip of the extension in src to w and returns its
// manifest.
func Write(src fs.FS, w io.Writer) (Manifest, error) {
	m, err := ReadManifest(src)
	if err != nil {
		return m, err
	}
	files, err := Files(src)
	if err != nil {
		return m, fmt.Errorf("pack: %w", err)
	}
	zw := zip.NewWriter(w)
	for _, p := range files {
		b, err := fs.ReadFile(src, p)
		if err != nil {
			return m, fmt.Errorf("pack: %w", err)
		}
		hdr := &zip.FileHeader{Name: p, Method: zip.Deflate, Modified: epoch}
		hdr.SetMode(0o644)
		f, err := zw.CreateHeader(hdr)
		if err != nil {
			return m, fmt.Errorf("pack: %w", err)
		}
		if _, err := f.Write(b); err != nil {
			return m, fmt.Errorf("pack: %w", err)
		}
	}
	return m, zw.Close()
}

// WriteFile writes the zip of the extension in dir to the file out.
func WriteFile(dir, out string) (Manifest, error) {
	f, err := os.Create(out)
	if err != nil {
		return Manifest{}, fmt.Errorf("pack: %w", err)
	}
	m, err := Write(os.DirFS(dir), f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
	}
	return m, err
}

// Unzip extracts the zip at file into dir, which must exist. Tests load the
// extension from what make extension ships.
func Unzip(file, dir string) error {
	zr, err := zip.OpenReader(file)
	if err != nil {
		return fmt.Errorf("unzip: %w", err)
	}
	defer zr.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("unzip: %w", err)
	}
	defer root.Close()
	for _, f := range zr.File {
		if err := unzipOne(root, f); err != nil {
			return fmt.Errorf("unzip %s: %w", f.Name, err)
		}
	}
	return nil
}

func unzipOne(root *os.Root, f *zip.File) error {
	if d := path.Dir(f.Name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	rc, err := f.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	w, err := root.Create(f.Name)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, rc); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
