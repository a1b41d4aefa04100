// Command ociimage writes a container image made of one root file system as
// a docker-archive tarball, the format `ctr images import` and
// `docker load` read. hack/kube-e2e.sh builds the node's images with it (no
// registry and no image builder are reachable there):
//
//	ociimage --rootfs DIR --tag REF --out FILE.tar \
//	  [--entrypoint /usr/local/bin/matbus] [--cmd --help] \
//	  [--user 65532:65532] [--env K=V]... [--workdir DIR] [--label K=V]...
//
// --entrypoint and --cmd take comma-separated argument lists. The layer
// keeps the modes of DIR's files and records every file as owned by uid/gid
// 0 unless the file belongs to a listed --chown UID:GID path. Errors (an
// unreadable root, a bad reference, a write error) exit 1 with the reason.
package main

import (
	"archive/tar"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	rootfs := fl.String("rootfs", "", "root file system folder (required)")
	tag := fl.String("tag", "", "image reference, e.g. docker.io/matbus/matbus:kube-e2e (required)")
	out := fl.String("out", "", "docker-archive tarball to write (required)")
	entrypoint := fl.String("entrypoint", "", "comma-separated entrypoint")
	cmd := fl.String("cmd", "", "comma-separated command")
	user := fl.String("user", "", "user[:group] the image runs as, e.g. 65532:65532")
	workdir := fl.String("workdir", "", "working directory")
	var env, labels, chown listFlag
	fl.Var(&env, "env", "K=V environment variable (repeatable)")
	fl.Var(&labels, "label", "K=V image label (repeatable)")
	fl.Var(&chown, "chown", "UID:GID=PATH: record PATH (relative to the root) and what is below it as owned by UID:GID (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *rootfs == "" || *tag == "" || *out == "" {
		return errors.New("--rootfs, --tag and --out are required")
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", *tag, err)
	}
	owners, err := parseChown(chown)
	if err != nil {
		return err
	}
	layerPath := *out + ".layer.tar"
	defer os.Remove(layerPath)
	if err := writeLayer(*rootfs, layerPath, owners); err != nil {
		return err
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.DockerLayer))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = split(*entrypoint)
	cf.Config.Cmd = split(*cmd)
	cf.Config.User = *user
	cf.Config.WorkingDir = *workdir
	cf.Config.Env = env
	if len(labels) > 0 {
		cf.Config.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return fmt.Errorf("--label %q: want K=V", l)
			}
			cf.Config.Labels[k] = v
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := tarball.WriteToFile(*out, ref, img); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	return nil
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

type owner struct {
	path     string
	uid, gid int
}

func parseChown(list []string) ([]owner, error) {
	var owners []owner
	for _, c := range list {
		ids, p, ok := strings.Cut(c, "=")
		var o owner
		if ok {
			_, err := fmt.Sscanf(ids, "%d:%d", &o.uid, &o.gid)
			ok = err == nil
		}
		if !ok || p == "" {
			return nil, fmt.Errorf("--chown %q: want UID:GID=PATH", c)
		}
		o.path = strings.Trim(filepath.Clean("/"+p), "/")
		owners = append(owners, o)
	}
	return owners, nil
}

// writeLayer tars dir into path with root ownership except for owners'
// paths, modes kept, times zeroed (the same root gives the same digest).
func writeLayer(dir, path string, owners []owner) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, werr error) error {
		if werr != nil {
			return werr
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		h.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		for _, o := range owners {
			if h.Name == o.path || strings.HasPrefix(h.Name, o.path+"/") {
				h.Uid, h.Gid = o.uid, o.gid
			}
		}
		h.ModTime, h.AccessTime, h.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return fmt.Errorf("layer of %s: %w", dir, err)
	}
	return tw.Close()
}
