package server

import _ "embed"

// openAPI is the OpenAPI 3 description of the HTTP API, served at
// /api/v1/openapi.json. A test keeps it and the registered routes in step.
//
//go:embed openapi.json
var openAPI []byte
