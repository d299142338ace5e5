# bash completion for berthctl                              -*- shell-script -*-
_berthctl() {
	local cur prev words cword
	_init_completion || return
	case $cword in
	1)
		COMPREPLY=($(compgen -W 'config status runs send help' -- "$cur"))
		return
		;;
	2)
		case ${words[1]} in
		config) COMPREPLY=($(compgen -W 'check' -- "$cur")) ;;
		runs) COMPREPLY=($(compgen -W 'list show cancel' -- "$cur")) ;;
		send) COMPREPLY=($(compgen -W '--timeout' -- "$cur")) ;;
		esac
		return
		;;
	esac
	case $prev in
	--config)
		_filedir toml
		return
		;;
	--state)
		COMPREPLY=($(compgen -W 'queued running succeeded failed canceled' -- "$cur"))
		return
		;;
	esac
	case "${words[1]} ${words[2]}" in
	"config check") COMPREPLY=($(compgen -W '--config --agent' -- "$cur")) ;;
	"runs list") COMPREPLY=($(compgen -W '--state --agent --limit --json' -- "$cur")) ;;
	"runs show") COMPREPLY=($(compgen -W '--json' -- "$cur")) ;;
	esac
} &&
	complete -F _berthctl berthctl
