// Package docs holds the project's documentation as Markdown, beside the
// README and deploy/README.md; it has no code. Its test checks that every
// relative link of every Markdown file in the repository names a file that
// exists and, for a Markdown target, a heading that the file has.
package docs
