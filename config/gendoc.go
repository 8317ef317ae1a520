//go:build ignore

// gendoc writes docs/config.md from config.go: go generate ./config.
package main

import (
	"log"
	"os"

	"github.com/flashgate/flashgate/config"
)

func main() {
	src, err := os.ReadFile("config.go")
	if err != nil {
		log.Fatal(err)
	}
	doc, err := config.Reference(src)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("../docs/config.md", doc, 0o644); err != nil {
		log.Fatal(err)
	}
}
